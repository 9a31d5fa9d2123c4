// Package agentprofile is what a container VM that hosts a BOSH agent
// (local container mode, a kubernetes pod with bosh_agent) starts and runs
// with: its first process and its capabilities.
package agentprofile

// Init is what a warden stemcell starts its services (the agent,
// monit, sshd) with: runit's runsvdir over /etc/service.
const Init = "/usr/sbin/runsvdir-start"

// Boot is a container VM's PID 1 (local container mode, a pod) when
// it has no command, as the warden CPI starts one: the agent's runtime dir
// fresh, the stemcell's time sync (chronyc) off — a container cannot set
// the clock — and runsvdir, which ends on SIGTERM.
var Boot = []string{"/bin/sh", "-c", "rm -rf /var/vcap/data/sys && mkdir -p /var/vcap/data/sys && " +
	"{ [ ! -f /var/vcap/bosh/bin/sync-time ] || sed -i 's/chronyc/# chronyc/g' /var/vcap/bosh/bin/sync-time; } && " +
	"exec env -i " + Init}

// DefaultCaps are every container VM's: runc's defaults.
var DefaultCaps = []string{"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"}

// Caps are what a BOSH agent and the jobs it runs need as root beyond
// runc's three default capabilities (bosh-agent's
// platform/linux_platform.go and the stemcell's runit services), each for
// a reason — and no more: the warden CPI makes fully privileged containers
// instead (docs/configuration.md, "The agent profile"). Local container
// mode and the kubernetes driver's bosh_agent VMs get them.
var Caps = []string{
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
