// Package container is the OCI runtime side of container VMs: the
// runtime config a VM gets, the runtime's commands, the supervisor that
// watches each VM's init, and the VM's cgroups.
package container

import (
	"fmt"
	"sort"
	"syscall"

	"github.com/moby/profiles/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"

	"github.com/runway-cpi/runway/src/driver/agentprofile"
	"github.com/runway-cpi/runway/src/driver/local/procs"
	"github.com/runway-cpi/runway/src/driver/local/storage"
)

// Where a warden stemcell's bosh-agent looks (agent.json's File settings
// source), and where the warden CPI puts persistent disks: the VM's side.
const (
	AgentSettingsPath = "/var/vcap/bosh/warden-cpi-agent-env.json"
	UserDataJSONPath  = "/var/vcap/bosh/warden-cpi-user-data.json"
	MetadataJSONPath  = "/var/vcap/bosh/warden-cpi-metadata.json"
	UserDataPath      = "/var/vcap/bosh/user-data"
	DisksDir          = "/warden-cpi-dev"
)

// VM is what a container VM's runtime config is made from.
type VM struct {
	CID, AgentID string
	// Rootfs is the VM's root file system; Devs the host directory its
	// disks are mounted below (DisksDir inside).
	Rootfs, Devs string
	Cgroup       string
	Argv         []string
	// Env: the cloud properties' environment (the marker cannot be set).
	Env map[string]string
	// Agent: the BOSH agent profile.
	Agent       bool
	RAMMiB, CPU int
	Pids        int64
	// IDs: the VM's user namespace maps its ids onto these host ids.
	IDs storage.IDRange
	// OwnMounts: file systems the runtime makes in the VM's user namespace.
	OwnMounts []OwnMount
}

// OwnMount is an overlay of one of the image's directories (Lower, seen
// through the VM's ids) on an upper directory of its own in the VM's
// writable layer, made by the runtime inside the VM's user namespace: its
// superblock is the VM's, so the VM's root may remount it. A remount
// without MS_BIND (mount DIR -o remount,nodev: what the BOSH agent does to
// /var/log, /home, /opt and /var/opt, binds of /var/vcap/data and /home)
// reconfigures the superblock, which a file system the host mounted — the
// root overlay — refuses to a user namespace. userxattr: the overlay keeps
// its metadata in user.overlay.* attributes, as one made in a user
// namespace must.
type OwnMount struct{ Dest, Lower, Upper, Work string }

// ociVersion: the spec version written; Debian 12's crun 1.8 refuses the
// library's newer one, and nothing used here is newer than 1.0.2.
const ociVersion = "1.0.2"

// Spec is the VM's OCI runtime config: the runtime's own defaults
// (what `runc spec` writes: namespaces, masked paths, three
// capabilities, no new privileges) plus hostname, limits, the disks mount
// and the VM's command and environment — nothing of the host's.
func Spec(v VM) (*specs.Spec, error) {
	caps := agentprofile.DefaultCaps
	noNewPrivs, nofile := true, uint64(1024)
	if v.Agent {
		caps = append(append([]string{}, agentprofile.DefaultCaps...), agentprofile.Caps...)
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
	env := []string{"PATH=" + procs.VMPath, "HOME=/root", "TERM=dumb",
		procs.EnvMarker + "=" + v.CID, "RUNWAY_AGENT_ID=" + v.AgentID,
		"RUNWAY_AGENT_SETTINGS=" + AgentSettingsPath, "RUNWAY_DISKS_DIR=" + DisksDir}
	keys := make([]string, 0, len(v.Env))
	for k := range v.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k != procs.EnvMarker {
			env = append(env, k+"="+v.Env[k])
		}
	}
	res := &specs.LinuxResources{
		Devices: []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}},
		Pids:    &specs.LinuxPids{Limit: v.Pids},
	}
	ram, cpu := v.RAMMiB, v.CPU
	limit := int64(ram) << 20
	res.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &limit}
	period := uint64(100000)
	quota := int64(cpu) * int64(period)
	res.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	spec := &specs.Spec{
		Version:  ociVersion,
		Hostname: v.CID,
		Root:     &specs.Root{Path: v.Rootfs, Readonly: false},
		Process: &specs.Process{
			User: specs.User{UID: 0, GID: 0},
			Args: v.Argv, Env: env, Cwd: "/",
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
			// rslave: disks mounted below devs later appear inside. The
			// directory itself is read-only and the host root's.
			{Destination: DisksDir, Type: "bind", Source: v.Devs, Options: []string{"rbind", "rslave", "ro", "nosuid", "nodev"}},
		},
		Linux: &specs.Linux{
			CgroupsPath:       v.Cgroup,
			Resources:         res,
			RootfsPropagation: "rslave",
			// A user namespace: root in the VM is an unprivileged host id,
			// and every capability the VM holds is the namespace's. A
			// cgroup namespace: its cgroups are its root, no hierarchy can
			// be made (no release_agent), no other VM's is in sight.
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.UserNamespace}, {Type: specs.PIDNamespace}, {Type: specs.NetworkNamespace},
				{Type: specs.IPCNamespace}, {Type: specs.UTSNamespace}, {Type: specs.MountNamespace},
				{Type: specs.CgroupNamespace},
			},
			UIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: v.IDs.Base, Size: v.IDs.Size}},
			GIDMappings: []specs.LinuxIDMapping{{ContainerID: 0, HostID: v.IDs.Base, Size: v.IDs.Size}},
			MaskedPaths: []string{"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
				"/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/sys/firmware", "/proc/scsi"},
			ReadonlyPaths: []string{"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"},
		},
		Annotations: map[string]string{"org.runway-cpi.vm": v.CID},
	}
	for _, m := range v.OwnMounts {
		spec.Mounts = append(spec.Mounts, specs.Mount{Destination: m.Dest, Type: "overlay", Source: "overlay",
			Options: []string{"lowerdir=" + m.Lower, "upperdir=" + m.Upper, "workdir=" + m.Work, "userxattr"}})
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
