package driver

// StemcellManifest is the cloud_properties every real stemcell carries:
// what the stemcell builder writes into stemcell.MF for any infrastructure
// (bosh-linux-stemcell-builder: bosh-stemcell's stemcell_packager.rb and
// infrastructure.rb) and bosh.io's light stemcells keep (infrastructure).
// The Director and bosh-cli pass them to create_stemcell verbatim. A
// driver embeds it in its stemcell props: the keys it reads it declares
// again with their types (the outer field wins); the rest are accepted and
// have no effect (docs/configuration.md, "Stemcell cloud properties").
type StemcellManifest struct {
	Name            any `json:"name"`
	Version         any `json:"version"`
	Infrastructure  any `json:"infrastructure"`
	Hypervisor      any `json:"hypervisor"`
	Disk            any `json:"disk"`
	DiskFormat      any `json:"disk_format"`
	ContainerFormat any `json:"container_format"`
	OSType          any `json:"os_type"`
	OSDistro        any `json:"os_distro"`
	Architecture    any `json:"architecture"`
	AutoDiskConfig  any `json:"auto_disk_config"`
	RootDeviceName  any `json:"root_device_name"`
	// PersistentDisks is Runway's own: how the stemcell's agent takes its
	// persistent disks in the local driver's container mode (see there);
	// the other drivers accept and ignore it.
	PersistentDisks any `json:"persistent_disks"`
}

// AgentInit is what a warden stemcell starts its services (the agent,
// monit, sshd) with: runit's runsvdir over /etc/service.
const AgentInit = "/usr/sbin/runsvdir-start"

// AgentBoot is a container VM's PID 1 (local container mode, a pod) when
// it has no command, as the warden CPI starts one: the agent's runtime dir
// fresh, the stemcell's time sync (chronyc) off — a container cannot set
// the clock — and runsvdir, which ends on SIGTERM.
var AgentBoot = []string{"/bin/sh", "-c", "rm -rf /var/vcap/data/sys && mkdir -p /var/vcap/data/sys && " +
	"{ [ ! -f /var/vcap/bosh/bin/sync-time ] || sed -i 's/chronyc/# chronyc/g' /var/vcap/bosh/bin/sync-time; } && " +
	"exec env -i " + AgentInit}

// DefaultCaps are every container VM's: runc's defaults.
var DefaultCaps = []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}

// AgentCaps are what a BOSH agent and the jobs it runs need as root beyond
// runc's three default capabilities (bosh-agent's
// platform/linux_platform.go and the stemcell's runit services), each for
// a reason — and no more: the warden CPI makes fully privileged containers
// instead (docs/configuration.md, "The agent profile"). Local container
// mode and the kubernetes driver's bosh_agent VMs get them.
var AgentCaps = []string{
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
