package ctrvm

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
)

// Config is the "local.container" section: how container VMs are run and
// networked.
type Config struct {
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
	// BoshAgent allows the agent profile: VMs that boot the stemcell's
	// agent (no command) get it, and cloud properties may ask for it
	// (bosh_agent: true) or turn it off; without it they may not.
	BoshAgent bool `json:"bosh_agent,omitempty"`
	// UIDBase is the first host uid (and gid) VMs' ids map onto: each
	// VM's root is an unprivileged host id of its own, 65536 apart.
	UIDBase uint32 `json:"uid_base,omitempty"`
	// DefaultRAMMiB and DefaultCPU limit a VM whose cloud properties
	// give no ram or cpu.
	DefaultRAMMiB int `json:"default_ram_mib,omitempty"`
	DefaultCPU    int `json:"default_cpu,omitempty"`
	// DefaultEphemeralDiskMiB sizes the writable layer of a VM whose
	// cloud properties give no ephemeral_disk_size.
	DefaultEphemeralDiskMiB int `json:"default_ephemeral_disk_mib,omitempty"`
	// MaxRAMMiB and MaxCPU bound what a VM's cloud properties may ask
	// for; default: the host's own memory and CPUs.
	MaxRAMMiB int `json:"max_ram_mib,omitempty"`
	MaxCPU    int `json:"max_cpu,omitempty"`
}

// Isolation is what local.isolation and a container VM's record name
// container VMs by.
const Isolation = "container"

// Defaults.
const (
	DefaultBridge     = "runway0"
	DefaultBridgeCIDR = "10.244.0.0/16"
	DefaultPidsLimit  = 4096
	DefaultRAMMiB     = 2048
	DefaultCPU        = 2
	// DefaultEphemeralDiskMiB: a VM's writable layer, all of it taken
	// from the state dir's file system when the VM is made.
	DefaultEphemeralDiskMiB = 4096
	// MinEphemeralDiskMiB: an ext4 file system with room for a VM's
	// writes beside its own metadata.
	MinEphemeralDiskMiB = 16
	// DefaultUIDBase: 2^30, far above any user a host's tools hand out.
	DefaultUIDBase = 1 << 30
	// maxHostname: HOST_NAME_MAX; the hostname is the CID.
	maxHostname = 64
)

// Complete validates the section and fills its defaults in, answering
// the bridge's network.
func (cc *Config) Complete() (netip.Prefix, error) {
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
	cc.Bridge = cmp.Or(cc.Bridge, DefaultBridge)
	if len(cc.Bridge) > 15 || !ifName(cc.Bridge) {
		return netip.Prefix{}, fmt.Errorf("local: container.bridge: %q is not an interface name (letters, digits, '-', '_', at most 15)", cc.Bridge)
	}
	cc.CIDR = cmp.Or(cc.CIDR, DefaultBridgeCIDR)
	p, err := netip.ParsePrefix(cc.CIDR)
	if err != nil || !p.Addr().Is4() || p.Bits() > 29 || p.Bits() < 8 {
		return netip.Prefix{}, fmt.Errorf("local: container.cidr: must be an IPv4 network of /8 to /29, got %q", cc.CIDR)
	}
	cc.PidsLimit = cmp.Or(cc.PidsLimit, DefaultPidsLimit)
	if cc.PidsLimit < 0 {
		return netip.Prefix{}, errors.New("local: container.pids_limit: must be positive")
	}
	cc.DefaultRAMMiB = cmp.Or(cc.DefaultRAMMiB, DefaultRAMMiB)
	cc.DefaultCPU = cmp.Or(cc.DefaultCPU, DefaultCPU)
	cc.UIDBase = cmp.Or(cc.UIDBase, DefaultUIDBase)
	if cc.UIDBase < 1<<17 || uint64(cc.UIDBase) > 1<<32-2*idsPerVM {
		return netip.Prefix{}, fmt.Errorf("local: container.uid_base: must lie between %d and %d, above the host's own users, got %d", 1<<17, uint64(1<<32-2*idsPerVM), cc.UIDBase)
	}
	if cc.DefaultRAMMiB < 0 || cc.DefaultCPU < 0 {
		return netip.Prefix{}, errors.New("local: container.default_ram_mib and default_cpu: must be positive")
	}
	cc.DefaultEphemeralDiskMiB = cmp.Or(cc.DefaultEphemeralDiskMiB, DefaultEphemeralDiskMiB)
	if cc.DefaultEphemeralDiskMiB < MinEphemeralDiskMiB {
		return netip.Prefix{}, fmt.Errorf("local: container.default_ephemeral_disk_mib: at least %d", MinEphemeralDiskMiB)
	}
	if cc.MaxRAMMiB == 0 {
		cc.MaxRAMMiB = hostMemMiB()
	}
	if cc.MaxCPU == 0 {
		cc.MaxCPU = runtime.NumCPU()
	}
	if cc.MaxRAMMiB < 0 || cc.MaxCPU < 0 {
		return netip.Prefix{}, errors.New("local: container.max_ram_mib and max_cpu: must be positive")
	}
	// The firewall is what keeps VMs from reaching beyond the host and
	// each other: no firewall, no container mode.
	if _, err := exec.LookPath("iptables"); err != nil {
		return netip.Prefix{}, errors.New(`local: isolation "container" needs iptables for the firewall that keeps VMs in (Debian's iptables package); none on PATH`)
	}
	if _, err := exec.LookPath("nft"); err != nil {
		return netip.Prefix{}, errors.New(`local: isolation "container" needs nft for the guard that keeps each VM to its own addresses on the bridge (Debian's nftables package); none on PATH`)
	}
	if !cgroupsMounted() {
		return netip.Prefix{}, errors.New(`local: isolation "container" needs the host's cgroup file systems, and this process sees none mounted (no cgroup or cgroup2 line in /proc/self/mountinfo), so the runtime cannot limit a VM ("no cgroup mount found in mountinfo"). "ip netns exec" does that: it mounts a /sys of its own without them. Enter a network namespace with "nsenter --net=/run/netns/NAME --" instead, which keeps the host's mounts`)
	}
	return p.Masked(), nil
}

// cgroupsMounted: the process's mount table holds a cgroup hierarchy (v1
// or v2), where the runtime finds each VM's cgroups. Unreadable: assumed.
func cgroupsMounted() bool {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return true
	}
	for _, line := range strings.Split(string(b), "\n") {
		if _, after, ok := strings.Cut(line, " - "); ok {
			if t, _, _ := strings.Cut(after, " "); t == "cgroup" || t == "cgroup2" {
				return true
			}
		}
	}
	return false
}

// hostMemMiB is the host's memory (MemTotal), or no bound when unknown.
func hostMemMiB() int {
	var si syscall.Sysinfo_t
	if syscall.Sysinfo(&si) != nil {
		return math.MaxInt32
	}
	return int(uint64(si.Totalram) * uint64(si.Unit) >> 20)
}

func ifName(s string) bool {
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return s != ""
}
