package local

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/driver"
)

// ContainerConfig is the "local.container" section: how container-mode
// VMs are run and networked.
type ContainerConfig struct {
	// Runtime is the OCI runtime's executable (runc or crun); default:
	// runc, else crun, from PATH.
	Runtime string `json:"runtime,omitempty"`
	// Bridge is the host bridge the driver manages; VMs get addresses on it.
	Bridge string `json:"bridge,omitempty"`
	// CIDR is the bridge's network: .1 is the host, the rest VMs.
	CIDR string `json:"cidr,omitempty"`
	// PidsLimit caps the processes of one VM (a fork bomb stays inside).
	PidsLimit int64 `json:"pids_limit,omitempty"`
	// NAT lets VMs reach beyond the host (masqueraded as the host, as
	// Garden and Docker do): what runners need to reach a forge elsewhere.
	// Connections into the VMs from beyond the host stay refused.
	NAT bool `json:"nat,omitempty"`
	// AllowVMToVM lets VMs on the bridge reach each other (a BOSH
	// Director's VMs talk to it); by default each reaches the host only.
	AllowVMToVM bool `json:"allow_vm_to_vm,omitempty"`
	// BoshAgent gives every VM the agent profile (cloud properties'
	// bosh_agent decide per VM).
	BoshAgent bool `json:"bosh_agent,omitempty"`
	// DefaultRAMMiB and DefaultCPU limit a VM whose cloud properties
	// give no ram or cpu.
	DefaultRAMMiB int `json:"default_ram_mib,omitempty"`
	DefaultCPU    int `json:"default_cpu,omitempty"`
}

// Container-mode defaults.
const (
	IsolationProcess   = "process"
	IsolationContainer = "container"
	DefaultBridge      = "runway0"
	DefaultBridgeCIDR  = "10.244.0.0/16"
	DefaultPidsLimit   = 4096
	DefaultRAMMiB      = 2048
	DefaultCPU         = 2
	// Where a warden stemcell's bosh-agent looks (agent.json's File
	// settings source), and where the warden CPI puts persistent disks.
	agentSettingsPath = "/var/vcap/bosh/warden-cpi-agent-env.json"
	userDataJSONPath  = "/var/vcap/bosh/warden-cpi-user-data.json"
	metadataJSONPath  = "/var/vcap/bosh/warden-cpi-metadata.json"
	userDataPath      = "/var/vcap/bosh/user-data"
	diskMountDir      = "/warden-cpi-dev"
	// maxHostname: HOST_NAME_MAX; the hostname is the CID.
	maxHostname = 64
)

// ociVersion: the spec version written; Debian 12's crun 1.8 refuses the
// library's newer one, and nothing used here is newer than 1.0.2.
const ociVersion = "1.0.2"

// agentInit is what a warden stemcell starts its services (the agent,
// monit, sshd) with: runit's runsvdir over /etc/service.
const agentInit = "/usr/sbin/runsvdir-start"

// agentBoot is a container VM's PID 1 when it has no command, as the
// warden CPI starts one: the agent's runtime dir fresh, the stemcell's
// time sync (chronyc) off — a container cannot set the clock — and
// runsvdir, which ends on SIGTERM.
var agentBoot = []string{"/bin/sh", "-c", "rm -rf /var/vcap/data/sys && mkdir -p /var/vcap/data/sys && " +
	"{ [ ! -f /var/vcap/bosh/bin/sync-time ] || sed -i 's/chronyc/# chronyc/g' /var/vcap/bosh/bin/sync-time; } && " +
	"exec env -i " + agentInit}

func (d *Driver) containers() bool { return d.cfg.Isolation == IsolationContainer }

// setupContainer validates and completes the container section.
func (c *Config) setupContainer() (netip.Prefix, error) {
	cc := &c.Container
	if cc.Runtime == "" {
		for _, name := range []string{"runc", "crun"} {
			if p, err := exec.LookPath(name); err == nil {
				cc.Runtime = p
				break
			}
		}
		if cc.Runtime == "" {
			return netip.Prefix{}, errors.New(`local: isolation "container" needs an OCI runtime: install runc (or crun), or set local.container.runtime`)
		}
	} else if !filepath.IsAbs(cc.Runtime) {
		return netip.Prefix{}, fmt.Errorf("local: container.runtime: must be an absolute path, got %q", cc.Runtime)
	}
	if cc.Bridge == "" {
		cc.Bridge = DefaultBridge
	}
	if len(cc.Bridge) > 15 || !ifName(cc.Bridge) {
		return netip.Prefix{}, fmt.Errorf("local: container.bridge: %q is not an interface name (letters, digits, '-', '_', at most 15)", cc.Bridge)
	}
	if cc.CIDR == "" {
		cc.CIDR = DefaultBridgeCIDR
	}
	p, err := netip.ParsePrefix(cc.CIDR)
	if err != nil || !p.Addr().Is4() || p.Bits() > 29 || p.Bits() < 8 {
		return netip.Prefix{}, fmt.Errorf("local: container.cidr: must be an IPv4 network of /8 to /29, got %q", cc.CIDR)
	}
	if cc.PidsLimit == 0 {
		cc.PidsLimit = DefaultPidsLimit
	}
	if cc.PidsLimit < 0 {
		return netip.Prefix{}, errors.New("local: container.pids_limit: must be positive")
	}
	if cc.DefaultRAMMiB == 0 {
		cc.DefaultRAMMiB = DefaultRAMMiB
	}
	if cc.DefaultCPU == 0 {
		cc.DefaultCPU = DefaultCPU
	}
	if cc.DefaultRAMMiB < 0 || cc.DefaultCPU < 0 {
		return netip.Prefix{}, errors.New("local: container.default_ram_mib and default_cpu: must be positive")
	}
	// The firewall is what keeps VMs from reaching beyond the host and
	// each other: no firewall, no container mode.
	if _, err := exec.LookPath("iptables"); err != nil {
		return netip.Prefix{}, errors.New(`local: isolation "container" needs iptables for the firewall that keeps VMs in (Debian's iptables package); none on PATH`)
	}
	return p.Masked(), nil
}

func ifName(s string) bool {
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return s != ""
}

// ctr names everything of one container VM.
type ctr struct {
	d   *Driver
	cid string
	dir string
}

func (d *Driver) ctr(cid string) ctr { return ctr{d: d, cid: cid, dir: d.path(vms, cid)} }

func (c ctr) bundle() string { return filepath.Join(c.dir, "bundle") }
func (c ctr) rootfs() string { return filepath.Join(c.dir, "rootfs") }
func (c ctr) devs() string   { return filepath.Join(c.dir, "devs") }

// stateKey tells apart the containers of different state dirs on one host
// (two drivers may use the same VM name).
func (d *Driver) stateKey() string {
	h := sha256.Sum256([]byte(d.root))
	return hex.EncodeToString(h[:4])
}

// id is the runtime's container id; cgroup is its cgroups path; hostIf
// the host end of its veth (IFNAMSIZ allows 15 bytes).
func (c ctr) id() string     { return "runway-" + c.d.stateKey() + "-" + c.cid }
func (c ctr) cgroup() string { return "/runway/" + c.d.stateKey() + "-" + c.cid }
func (c ctr) hostIf() string {
	h := sha256.Sum256([]byte(c.d.root + "\x00" + c.cid))
	return "rw" + hex.EncodeToString(h[:6])
}

// runtimeRoot is the runtime's own state, kept under the state dir.
func (d *Driver) runtimeRoot() string { return filepath.Join(d.root, "runtime") }

// runtime runs the OCI runtime with args and returns its combined output.
func (d *Driver) runtime(ctx context.Context, args ...string) ([]byte, error) {
	rt := d.cfg.Container.Runtime
	if rt == "" { // process mode now, deleting a VM made in container mode
		for _, name := range []string{"runc", "crun"} {
			if p, err := exec.LookPath(name); err == nil {
				rt = p
				break
			}
		}
		if rt == "" {
			return nil, errors.New("no OCI runtime (runc, crun) on PATH")
		}
	}
	cmd := exec.CommandContext(ctx, rt, append([]string{"--root", d.runtimeRoot()}, args...)...)
	cmd.Env = []string{"PATH=" + vmPath}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", filepath.Base(rt), args[0], err, bytes.TrimSpace(out))
	}
	return out, nil
}

// runContainer makes and starts a published container VM.
func (d *Driver) runContainer(ctx context.Context, rec vmRecord, props vmProps, settings []byte, userData string) error {
	if err := d.prepareContainer(rec, props, rec.Command, settings, userData); err != nil {
		return err
	}
	if err := d.ensureBridge(ctx); err != nil {
		return err
	}
	ram, _ := d.limits(props)
	return d.startContainer(ctx, rec, d.netPlan(d.ctr(rec.CID), rec.Networks), ram)
}

// prepareContainer makes a published VM's bundle: the root file system
// (an overlay on the stemcell's unpacked image), the disks mount point,
// the settings files inside and the OCI config. Everything it mounts lies
// under the VM's directory, where teardown finds it.
func (d *Driver) prepareContainer(rec vmRecord, props vmProps, argv []string, settings []byte, userData string) error {
	c := d.ctr(rec.CID)
	for _, dir := range []string{c.bundle(), c.rootfs(), c.devs(), filepath.Join(c.dir, "upper"), filepath.Join(c.dir, "work")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
	}
	if err := d.mountVM(rec); err != nil {
		return err
	}
	if err := d.writeInside(rec, settings, userData); err != nil {
		return err
	}
	if len(argv) == 0 {
		// A VM recorded before create_vm started the stemcell's init (or
		// refused a VM with nothing to run) idles.
		argv = []string{"/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"}
	}
	spec, err := d.ociSpec(c, rec, props, argv)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.bundle(), "config.json"), b, 0o600)
}

// mountVM mounts the VM's root (an overlay on the stemcell's image) and
// its disks directory, unless mounted: after the host restarted, a VM
// starts again from its directory, with the disks attached to it.
func (d *Driver) mountVM(rec vmRecord) error {
	c := d.ctr(rec.CID)
	if mps, _ := mountsUnder(c.rootfs()); len(mps) > 0 {
		return nil
	}
	image := filepath.Join(d.path(stemcells, rec.StemcellCID), "image")
	for _, p := range []string{image, c.dir} {
		if strings.ContainsAny(p, ",:") {
			return fmt.Errorf("path %s holds ',' or ':', which an overlay mount cannot take", p)
		}
	}
	// The overlay's root takes the upper directory's owner and mode: the
	// image root's, or every user but root is kept out of the VM's /.
	upper := filepath.Join(c.dir, "upper")
	if fi, err := os.Stat(image); err != nil {
		return err
	} else if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if err := os.Chown(upper, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		if err := os.Chmod(upper, fi.Mode()&(os.ModePerm|os.ModeSticky)); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", image, upper, filepath.Join(c.dir, "work"))
	if err := unix.Mount("overlay", c.rootfs(), "overlay", 0, opts); err != nil {
		return fmt.Errorf("mounting the vm's root file system: %w", err)
	}
	// Disks are mounted below devs on the host; being a shared mount, each
	// one propagates into the running container's slave copy.
	if mps, _ := mountsUnder(c.devs()); len(mps) == 0 {
		if err := unix.Mount(c.devs(), c.devs(), "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding the disks directory: %w", err)
		}
		if err := unix.Mount("", c.devs(), "", unix.MS_SHARED, ""); err != nil {
			return fmt.Errorf("sharing the disks directory: %w", err)
		}
		links, _ := os.ReadDir(filepath.Join(c.dir, "disks"))
		for _, l := range links {
			if checkCID("disk", l.Name()) != nil {
				continue
			}
			if dr, err := d.loadDisk(l.Name()); err == nil && dr.AttachedTo == rec.CID {
				if _, err := d.attachInside(rec.CID, l.Name()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// writeInside puts the agent settings and user data where a warden
// stemcell's bosh-agent reads them. The root is the VM's own file system,
// so every path is resolved inside it (os.Root): a symlink the image (or
// a running VM) planted cannot make bin/cpi write on the host.
func (d *Driver) writeInside(rec vmRecord, settings []byte, userData string) error {
	root, err := os.OpenRoot(d.ctr(rec.CID).rootfs())
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.MkdirAll(strings.TrimPrefix(filepath.Dir(agentSettingsPath), "/"), 0o755); err != nil {
		return fmt.Errorf("making %s in the vm: %w", filepath.Dir(agentSettingsPath), err)
	}
	if err := root.MkdirAll(strings.TrimPrefix(diskMountDir, "/"), 0o755); err != nil {
		return fmt.Errorf("making %s in the vm: %w", diskMountDir, err)
	}
	write := func(path string, b []byte, mode os.FileMode) error {
		if err := root.WriteFile(strings.TrimPrefix(path, "/"), b, mode); err != nil {
			return fmt.Errorf("writing %s in the vm: %w", path, err)
		}
		return nil
	}
	if settings != nil {
		if err := write(agentSettingsPath, settings, 0o600); err != nil {
			return err
		}
	}
	ud, _ := json.Marshal(map[string]any{
		"server":   map[string]string{"name": rec.CID},
		"registry": map[string]string{"endpoint": agentSettingsPath},
	})
	md, _ := json.Marshal(map[string]any{"instance-id": rec.CID, "hostname": rec.CID})
	if err := write(userDataJSONPath, ud, 0o600); err != nil {
		return err
	}
	if err := write(metadataJSONPath, md, 0o600); err != nil {
		return err
	}
	// The VM's resolver: its networks' DNS, else the host's (a link the
	// image has there, into a resolver daemon's runtime dir, is replaced).
	if fi, err := root.Lstat("etc/resolv.conf"); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if err := root.Remove("etc/resolv.conf"); err != nil {
			return fmt.Errorf("replacing /etc/resolv.conf in the vm: %w", err)
		}
	}
	if err := write("/etc/resolv.conf", resolvConf(rec.Networks), 0o644); err != nil {
		return err
	}
	if userData != "" {
		return write(userDataPath, []byte(userData), 0o700)
	}
	return nil
}

// resolvConf is /etc/resolv.conf for a VM on nets: the DNS servers of the
// network that is the default for dns first, then the others', each once;
// none at all: the host's resolv.conf.
func resolvConf(nets driver.Networks) []byte {
	names := slices.Sorted(maps.Keys(nets))
	sort.SliceStable(names, func(i, j int) bool {
		return slices.Contains(nets[names[i]].Default, "dns") && !slices.Contains(nets[names[j]].Default, "dns")
	})
	var b strings.Builder
	seen := map[string]bool{}
	for _, name := range names {
		for _, s := range nets[name].DNS {
			if net.ParseIP(s) != nil && !seen[s] {
				seen[s] = true
				fmt.Fprintf(&b, "nameserver %s\n", s)
			}
		}
	}
	if b.Len() == 0 {
		host, err := os.ReadFile("/etc/resolv.conf")
		if err != nil {
			return nil
		}
		return host
	}
	return []byte(b.String())
}

// withAddresses answers the agent settings with the networks the VM got:
// a dynamic network's address is only known here.
func withAddresses(settings []byte, nets driver.Networks) []byte {
	var m map[string]any
	if settings == nil || json.Unmarshal(settings, &m) != nil || m == nil {
		return settings
	}
	n, _ := m["networks"].(map[string]any)
	if n == nil {
		n = map[string]any{}
	}
	for name, nw := range nets {
		entry, _ := n[name].(map[string]any)
		if entry == nil {
			entry = map[string]any{"type": nw.Type}
		}
		entry["ip"], entry["netmask"], entry["gateway"] = nw.IP, nw.Netmask, nw.Gateway
		// The driver configured the interface: the agent must not.
		entry["preconfigured"] = true
		n[name] = entry
	}
	m["networks"] = n
	b, err := json.Marshal(m)
	if err != nil {
		return settings
	}
	return b
}

// defaultCaps are every container VM's: runc's defaults.
var defaultCaps = []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}

// agentCaps are what a BOSH agent and the jobs it runs need as root beyond
// those (bosh-agent's platform/linux_platform.go and the stemcell's runit
// services), each for a reason — and no more: the warden CPI makes fully
// privileged containers instead (docs/configuration.md, "The agent profile").
var agentCaps = []string{
	"CAP_CHOWN",        // useradd/usermod rewrite /etc/passwd and /etc/shadow; root:vcap on the agent's dirs
	"CAP_DAC_OVERRIDE", // root reads and writes files of vcap and the jobs' users
	"CAP_FOWNER",       // chmod of files root does not own (/dev/shm, job dirs)
	"CAP_FSETID",       // files root changes keep their setuid/setgid bits
	"CAP_SETUID",       // jobs run as vcap (monit, chpst), sudo, su, sshd
	"CAP_SETGID",       // likewise, their groups
	"CAP_SYS_ADMIN",    // the agent's mounts (tmpfs, bind, remounts, the persistent disk at /var/vcap/store) and hostname
	"CAP_NET_ADMIN",    // the agent's nftables firewall for monit, in the VM's own network namespace
	"CAP_SYS_CHROOT",   // sshd's privilege separation (bosh ssh)
}

// ociSpec is the VM's OCI runtime config: the runtime's own defaults
// (what `runc spec` writes: namespaces, masked paths, three
// capabilities, no new privileges) plus hostname, limits, the disks mount
// and the VM's command and environment — nothing of the host's.
func (d *Driver) ociSpec(c ctr, rec vmRecord, p vmProps, argv []string) (*specs.Spec, error) {
	caps := defaultCaps
	noNewPrivs, nofile := true, uint64(1024)
	if d.agentProfile(p) {
		caps = append(append([]string{}, defaultCaps...), agentCaps...)
		// Jobs and bosh ssh users switch users (sudo, su: setuid), and
		// servers such as NATS and PostgreSQL hold many files: up to
		// 65536, within the host's own hard limit (raising past it needs
		// CAP_SYS_RESOURCE, which no VM gets).
		noNewPrivs, nofile = false, 65536
		var host syscall.Rlimit
		if syscall.Getrlimit(syscall.RLIMIT_NOFILE, &host) == nil && host.Max < nofile {
			nofile = host.Max
		}
	}
	env := []string{"PATH=" + vmPath, "HOME=/root", "TERM=dumb",
		envMarker + "=" + rec.CID, "RUNWAY_AGENT_ID=" + rec.AgentID,
		"RUNWAY_AGENT_SETTINGS=" + agentSettingsPath, "RUNWAY_DISKS_DIR=" + diskMountDir}
	keys := make([]string, 0, len(p.Env))
	for k := range p.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k != envMarker {
			env = append(env, k+"="+p.Env[k])
		}
	}
	pids := d.cfg.Container.PidsLimit
	res := &specs.LinuxResources{
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
		Pids:    &specs.LinuxPids{Limit: pids},
	}
	ram, cpu := d.limits(p)
	limit := int64(ram) << 20
	res.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &limit}
	period := uint64(100000)
	quota := int64(cpu) * int64(period)
	res.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	spec := &specs.Spec{
		Version:  ociVersion,
		Hostname: rec.CID,
		Root:     &specs.Root{Path: c.rootfs(), Readonly: false},
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: argv, Env: env, Cwd: "/",
			Capabilities:    &specs.LinuxCapabilities{Bounding: caps, Effective: caps, Permitted: caps},
			Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: nofile, Soft: nofile}},
			NoNewPrivileges: noNewPrivs,
		},
		Mounts: []specs.Mount{
			{Destination: "/proc", Type: "proc", Source: "proc"},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/dev/mqueue", Type: "mqueue", Source: "mqueue", Options: []string{"nosuid", "noexec", "nodev"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev", "relatime", "ro"}},
			// rslave: disks mounted below devs later appear inside.
			{Destination: diskMountDir, Type: "bind", Source: c.devs(), Options: []string{"rbind", "rslave"}},
		},
		Linux: &specs.Linux{
			CgroupsPath:       c.cgroup(),
			Resources:         res,
			RootfsPropagation: "rslave",
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace}, {Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
			},
			MaskedPaths: []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
		Annotations: map[string]string{"org.runway-cpi.vm": rec.CID},
	}
	// The seccomp profile Docker and containerd apply by default, with the
	// syscalls the VM's capabilities call for.
	sc, err := seccomp.GetDefaultProfile(spec)
	if err != nil {
		return nil, fmt.Errorf("the default seccomp profile: %w", err)
	}
	spec.Linux.Seccomp = sc
	return spec, nil
}

// limits are the VM's memory (MiB) and CPUs: its cloud properties', else
// the configured defaults.
func (d *Driver) limits(p vmProps) (ramMiB, cpu int) {
	ramMiB, cpu = p.RAM, p.CPU
	if ramMiB <= 0 {
		ramMiB = d.cfg.Container.DefaultRAMMiB
	}
	if cpu <= 0 {
		cpu = d.cfg.Container.DefaultCPU
	}
	return ramMiB, cpu
}

// stopContainer ends a container VM for certain: SIGTERM reaches the VM's
// PID 1 through its supervisor, SIGKILL follows after the grace; then the
// runtime's forced delete, and whatever is left in the VM's cgroups (a
// runtime killed part-way through a create) is killed and removed.
func (d *Driver) stopContainer(ctx context.Context, cid string) error {
	c := d.ctr(cid)
	err := stopVM(ctx, cid, readPGID(c.dir), d.grace())
	_, _ = d.runtime(ctx, "delete", "--force", c.id())
	if cerr := c.killCgroups(ctx); cerr != nil {
		return cerr
	}
	if err != nil {
		return err
	}
	// A supervisor found by marker only (create killed part-way) may have
	// started a runtime meanwhile: look once more.
	return stopVM(ctx, cid, 0, d.grace())
}

// cgroupDirs lists the VM's cgroup directories on this host, under every
// v1 controller hierarchy and the v2 one.
func (c ctr) cgroupDirs() []string {
	var out []string
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	hier = append(hier, "/sys/fs/cgroup")
	for _, h := range hier {
		p := filepath.Join(h, c.cgroup())
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

// killCgroups kills every process left in the VM's cgroups and removes
// them.
func (c ctr) killCgroups(ctx context.Context) error {
	dirs := c.cgroupDirs()
	if len(dirs) == 0 {
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		alive := false
		for _, dir := range dirs {
			b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					alive = true
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if !alive {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("processes of vm %s still in its cgroups after SIGKILL", c.cid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, dir := range dirs {
		if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing cgroup %s: %w", dir, err)
		}
	}
	return nil
}

// teardownContainer undoes what prepareContainer and the network set up,
// after the VM is stopped: the host end of the veth, then every mount under
// the VM's directory, innermost first. It fails rather than leave a mount
// (removing the directory with a disk still mounted would delete the
// disk's data).
func (d *Driver) teardownContainer(cid string) error {
	c := d.ctr(cid)
	if err := deleteLink(c.hostIf()); err != nil {
		return err
	}
	if err := unmountAll(c.dir); err != nil {
		return err
	}
	// Belt and braces before the directory is removed: a mount the
	// mount table did not show under this path (a symlinked state dir)
	// would have another device.
	var top syscall.Stat_t
	if err := syscall.Stat(c.dir, &top); err != nil {
		return err
	}
	check := []string{c.rootfs(), c.devs()}
	if ents, err := os.ReadDir(c.devs()); err == nil {
		for _, e := range ents {
			check = append(check, filepath.Join(c.devs(), e.Name()))
		}
	}
	for _, p := range check {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err == nil && st.Dev != top.Dev {
			return fmt.Errorf("%s is still a mount point: not removing vm %s", p, c.cid)
		}
	}
	return nil
}

// mountsUnder lists the mount points at or below dir, innermost first.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	// Deepest first; a path mounted twice is listed twice.
	sort.SliceStable(out, func(i, j int) bool { return strings.Count(out[i], "/") > strings.Count(out[j], "/") })
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll unmounts everything at or below dir and checks none is left.
func unmountAll(dir string) error {
	for range 3 {
		mps, err := mountsUnder(dir)
		if err != nil {
			return err
		}
		if len(mps) == 0 {
			return nil
		}
		for _, mp := range mps {
			if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("unmounting %s: %w", mp, err)
			}
		}
	}
	if mps, _ := mountsUnder(dir); len(mps) > 0 {
		return fmt.Errorf("still mounted after unmounting: %s", strings.Join(mps, ", "))
	}
	return nil
}

// attachInside mounts a disk's data directory where the VM sees it.
func (d *Driver) attachInside(vm, disk string) (string, error) {
	c := d.ctr(vm)
	target := filepath.Join(c.devs(), disk)
	if mps, _ := mountsUnder(target); len(mps) > 0 {
		return diskMountDir + "/" + disk, nil // attached before
	}
	if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	if err := unix.Mount(filepath.Join(d.path(disks, disk), "data"), target, "", unix.MS_BIND, ""); err != nil {
		return "", fmt.Errorf("mounting disk %s into vm %s: %w", disk, vm, err)
	}
	return diskMountDir + "/" + disk, nil
}

// detachInside unmounts a disk from the VM (it disappears inside at once).
func (d *Driver) detachInside(vm, disk string) error {
	target := filepath.Join(d.ctr(vm).devs(), disk)
	if err := unmountAll(target); err != nil {
		return err
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// updateDiskSettings records an attached (path) or detached ("") disk in
// the agent settings inside the VM, as the warden CPI does.
func (d *Driver) updateDiskSettings(vm, disk, path string) error {
	root, err := os.OpenRoot(d.ctr(vm).rootfs())
	if err != nil {
		return err
	}
	defer root.Close()
	name := strings.TrimPrefix(agentSettingsPath, "/")
	b, err := root.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no settings given: nothing to keep current
	}
	if err != nil {
		return err
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil || m == nil {
		return nil
	}
	ds, _ := m["disks"].(map[string]any)
	if ds == nil {
		ds = map[string]any{}
	}
	p, _ := ds["persistent"].(map[string]any)
	if p == nil {
		p = map[string]any{}
	}
	if path == "" {
		delete(p, disk)
	} else {
		p[disk] = path
	}
	ds["persistent"] = p
	m["disks"] = ds
	out, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return root.WriteFile(name, out, 0o600)
}

// findExecutableIn checks the command exists in the VM's image.
func findExecutableIn(image, name string) error {
	root, err := os.OpenRoot(image)
	if err != nil {
		return err
	}
	defer root.Close()
	ok := func(p string) bool {
		st, err := root.Stat(strings.TrimPrefix(p, "/"))
		if err != nil {
			// An absolute symlink (/etc/alternatives) cannot be followed
			// inside a root: the VM's own exec will tell.
			return !errors.Is(err, fs.ErrNotExist)
		}
		return !st.IsDir() && st.Mode()&0o111 != 0
	}
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) || ok(name) {
			return nil
		}
		return fmt.Errorf("command %s is not an executable file in the stemcell", name)
	}
	if slices.ContainsFunc(filepath.SplitList(vmPath), func(dir string) bool { return ok(filepath.Join(dir, name)) }) {
		return nil
	}
	return fmt.Errorf("command %q not found in the stemcell's %s", name, vmPath)
}
