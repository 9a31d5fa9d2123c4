package local

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/runway-cpi/runway/src/driver/catalog"
	"github.com/runway-cpi/runway/src/driver/local/ctrvm"
)

// Config is the "local" section of the CPI config.
type Config struct {
	// StopGraceSeconds: time between SIGTERM and SIGKILL of a VM's processes.
	StopGraceSeconds int `json:"stop_grace_seconds,omitempty"`
	// StemcellFormats reported by info.
	StemcellFormats []string `json:"stemcell_formats,omitempty"`
	// LoopbackCIDR is where dynamic network addresses come from.
	LoopbackCIDR string `json:"loopback_cidr,omitempty"`
	// Shell runs string commands and user-data scripts without a #! line.
	Shell string `json:"shell,omitempty"`
	// RunProcesses: false records VMs without ever running their command
	// (state-only hosts, fuzzing). Default true.
	RunProcesses *bool `json:"run_processes,omitempty"`
	// MaxImageMiB caps what one stemcell image may unpack to.
	MaxImageMiB int `json:"max_image_mib,omitempty"`
	// MaxImageEntries caps the files one stemcell image may hold (empty
	// files cost inodes, not bytes).
	MaxImageEntries int `json:"max_image_entries,omitempty"`
	// ConsoleMaxKiB caps a VM's console.log; past it the log becomes
	// console.log.1 and a new one starts.
	ConsoleMaxKiB int `json:"console_max_kib,omitempty"`
	// Isolation: "process" (VMs are process groups on the host, the
	// default) or "container" (each VM an OCI container made from a rootfs
	// stemcell, with its own address on a bridge; needs root and runc).
	Isolation string `json:"isolation,omitempty"`
	// Container configures isolation "container".
	Container ctrvm.Config `json:"container,omitempty"`
}

// Defaults.
var (
	DefaultStemcellFormats = catalog.Formats("local")
)

// Isolation modes (isolation).
const (
	IsolationProcess   = "process"
	IsolationContainer = ctrvm.Isolation
)

const (
	DefaultStopGrace    = 5
	DefaultLoopbackCIDR = "127.101.0.0/16"
	DefaultShell        = "/bin/sh"
	DefaultMaxImageMiB  = 10 << 10
	// DefaultMaxImageEntries: a stemcell's root file system holds tens of
	// thousands of files.
	DefaultMaxImageEntries = 150000
	// DefaultConsoleMaxKiB: 10 MiB of console, twice (a day of an agent
	// writing ~1.4 KB/s fills ~120 MB).
	DefaultConsoleMaxKiB = 10 << 10
)

// complete fills the defaults in and validates, answering the address
// range VMs get addresses from and the state dir as used (resolved in
// container mode: mounts are found by path in the mount table, which
// holds resolved paths).
func (c *Config) complete(stateDir string) (netip.Prefix, string, error) {
	c.StopGraceSeconds = cmp.Or(c.StopGraceSeconds, DefaultStopGrace)
	if c.StopGraceSeconds < 0 {
		return netip.Prefix{}, "", errors.New("local: stop_grace_seconds: must be positive")
	}
	if len(c.StemcellFormats) == 0 {
		c.StemcellFormats = DefaultStemcellFormats
	}
	c.LoopbackCIDR = cmp.Or(c.LoopbackCIDR, DefaultLoopbackCIDR)
	p, err := netip.ParsePrefix(c.LoopbackCIDR)
	if err != nil || !p.Addr().Is4() || !p.Addr().IsLoopback() || p.Bits() > 30 {
		return netip.Prefix{}, "", fmt.Errorf("local: loopback_cidr: must be an IPv4 range inside 127.0.0.0/8 with at least 4 addresses, got %q", c.LoopbackCIDR)
	}
	switch c.Isolation {
	case "", IsolationProcess:
		c.Isolation = IsolationProcess
	case IsolationContainer:
		if os.Geteuid() != 0 {
			return netip.Prefix{}, "", errors.New(`local: isolation "container" needs root (mounts, cgroups, network namespaces)`)
		}
		if p, err = c.Container.Complete(); err != nil {
			return netip.Prefix{}, "", err
		}
		// Mounts are found by path in the mount table, which holds
		// resolved paths.
		if err := os.MkdirAll(stateDir, 0o700); err != nil {
			return netip.Prefix{}, "", fmt.Errorf("local: state dir: %w", err)
		}
		if stateDir, err = filepath.Abs(stateDir); err == nil {
			stateDir, err = filepath.EvalSymlinks(stateDir)
		}
		if err != nil {
			return netip.Prefix{}, "", fmt.Errorf("local: state dir: %w", err)
		}
	default:
		return netip.Prefix{}, "", fmt.Errorf(`local: isolation: must be "process" or "container", got %q`, c.Isolation)
	}
	c.Shell = cmp.Or(c.Shell, DefaultShell)
	c.MaxImageMiB = cmp.Or(c.MaxImageMiB, DefaultMaxImageMiB)
	if c.MaxImageMiB < 0 {
		return netip.Prefix{}, "", errors.New("local: max_image_mib: must be positive")
	}
	c.ConsoleMaxKiB = cmp.Or(c.ConsoleMaxKiB, DefaultConsoleMaxKiB)
	if c.ConsoleMaxKiB < 0 {
		return netip.Prefix{}, "", errors.New("local: console_max_kib: must be positive")
	}
	c.MaxImageEntries = cmp.Or(c.MaxImageEntries, DefaultMaxImageEntries)
	if c.MaxImageEntries < 0 {
		return netip.Prefix{}, "", errors.New("local: max_image_entries: must be positive")
	}
	if !filepath.IsAbs(c.Shell) {
		return netip.Prefix{}, "", fmt.Errorf("local: shell: must be an absolute path, got %q", c.Shell)
	}
	return p.Masked(), stateDir, nil
}
