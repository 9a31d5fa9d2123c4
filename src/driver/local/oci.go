package local

import (
	"fmt"
	"sort"
	"syscall"

	"github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/runway-cpi/runway/src/driver"
)

// ociVersion: the spec version written; Debian 12's crun 1.8 refuses the
// library's newer one, and nothing used here is newer than 1.0.2.
const ociVersion = "1.0.2"

// ociSpec is the VM's OCI runtime config: the runtime's own defaults
// (what `runc spec` writes: namespaces, masked paths, three
// capabilities, no new privileges) plus hostname, limits, the disks mount
// and the VM's command and environment — nothing of the host's.
func (d *Driver) ociSpec(c ctr, rec vmRecord, p vmProps, argv []string) (*specs.Spec, error) {
	caps := driver.DefaultCaps
	noNewPrivs, nofile := true, uint64(1024)
	if d.agentProfile(p) {
		caps = append(append([]string{}, driver.DefaultCaps...), driver.AgentCaps...)
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
