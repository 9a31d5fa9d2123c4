// Package local is the embedded default driver: VMs are supervised local
// process groups, disks are directories, everything lives under a state
// dir and is guarded by cross-process locks.
package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/google/uuid"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/catalog"
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/logging"
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
	// Isolation: "process" (VMs are process groups on the host, the
	// default) or "container" (each VM an OCI container made from a rootfs
	// stemcell, with its own address on a bridge; needs root and runc).
	Isolation string `json:"isolation,omitempty"`
	// Container configures isolation "container".
	Container ContainerConfig `json:"container,omitempty"`
}

// Defaults.
var (
	DefaultStemcellFormats = catalog.Formats("local")
)

const (
	DefaultStopGrace    = 5
	DefaultLoopbackCIDR = "127.101.0.0/16"
	DefaultShell        = "/bin/sh"
	DefaultMaxImageMiB  = 10 << 10
	// DefaultMaxImageEntries: a stemcell's root file system holds tens of
	// thousands of files.
	DefaultMaxImageEntries = 150000
)

// Driver implements driver.Driver on the local host.
type Driver struct {
	cfg    Config
	prefix netip.Prefix
	root   string
	locks  *lock.Locker
	log    logging.Logger
}

var (
	_ driver.Driver       = (*Driver)(nil)
	_ driver.VMSizer      = (*Driver)(nil)
	_ driver.VMLister     = (*Driver)(nil)
	_ driver.PowerSwitch  = (*Driver)(nil)
	_ driver.DiskResizer  = (*Driver)(nil)
	_ driver.DiskMetadata = (*Driver)(nil)
	_ driver.Snapshotter  = (*Driver)(nil)
)

func init() {
	// Every local key configures the host (its processes, bridge, runtime,
	// shell, limits): a request context may set none of them.
	driver.Register(driver.Registration{Name: "local", Config: &Config{},
		New: func(section json.RawMessage, deps driver.Deps) (driver.Driver, error) {
			return New(section, deps.StateDir, deps.Locker, deps.Logger)
		}})
}

// New builds the driver from its config section.
func New(section json.RawMessage, stateDir string, locks *lock.Locker, log logging.Logger) (*Driver, error) {
	var c Config
	if err := driver.DecodeConfig("local", section, &c); err != nil {
		return nil, err
	}
	if c.StopGraceSeconds == 0 {
		c.StopGraceSeconds = DefaultStopGrace
	}
	if c.StopGraceSeconds < 0 {
		return nil, errors.New("local: stop_grace_seconds: must be positive")
	}
	if len(c.StemcellFormats) == 0 {
		c.StemcellFormats = DefaultStemcellFormats
	}
	if c.LoopbackCIDR == "" {
		c.LoopbackCIDR = DefaultLoopbackCIDR
	}
	p, err := netip.ParsePrefix(c.LoopbackCIDR)
	if err != nil || !p.Addr().Is4() || !p.Addr().IsLoopback() || p.Bits() > 30 {
		return nil, fmt.Errorf("local: loopback_cidr: must be an IPv4 range inside 127.0.0.0/8 with at least 4 addresses, got %q", c.LoopbackCIDR)
	}
	switch c.Isolation {
	case "", IsolationProcess:
		c.Isolation = IsolationProcess
	case IsolationContainer:
		if os.Geteuid() != 0 {
			return nil, errors.New(`local: isolation "container" needs root (mounts, cgroups, network namespaces)`)
		}
		if p, err = c.setupContainer(); err != nil {
			return nil, err
		}
		// Mounts are found by path in the mount table, which holds
		// resolved paths.
		if err := os.MkdirAll(stateDir, 0o700); err != nil {
			return nil, fmt.Errorf("local: state dir: %w", err)
		}
		if stateDir, err = filepath.Abs(stateDir); err == nil {
			stateDir, err = filepath.EvalSymlinks(stateDir)
		}
		if err != nil {
			return nil, fmt.Errorf("local: state dir: %w", err)
		}
	default:
		return nil, fmt.Errorf(`local: isolation: must be "process" or "container", got %q`, c.Isolation)
	}
	if c.Shell == "" {
		c.Shell = DefaultShell
	}
	if c.MaxImageMiB == 0 {
		c.MaxImageMiB = DefaultMaxImageMiB
	}
	if c.MaxImageMiB < 0 {
		return nil, errors.New("local: max_image_mib: must be positive")
	}
	if c.MaxImageEntries == 0 {
		c.MaxImageEntries = DefaultMaxImageEntries
	}
	if c.MaxImageEntries < 0 {
		return nil, errors.New("local: max_image_entries: must be positive")
	}
	if !filepath.IsAbs(c.Shell) {
		return nil, fmt.Errorf("local: shell: must be an absolute path, got %q", c.Shell)
	}
	if log == nil {
		log = logging.Discard()
	}
	d := &Driver{cfg: c, prefix: p.Masked(), root: stateDir, locks: locks, log: log}
	for _, sub := range []string{"stemcells", "vms", "disks", "snapshots"} {
		if err := os.MkdirAll(filepath.Join(stateDir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("local: state dir: %w", err)
		}
	}
	return d, nil
}

// StemcellFormats implements driver.Driver.
func (d *Driver) StemcellFormats() []string { return d.cfg.StemcellFormats }

// maxCIDLen keeps paths well under PATH_MAX and names under NAME_MAX.
const maxCIDLen = 128

// checkCID validates a CID before it becomes a path component.
func checkCID(kind, cid string) error {
	switch {
	case cid == "":
		return driver.Invalid("%s cid must not be empty", kind)
	case len(cid) > maxCIDLen:
		return driver.Invalid("%s cid is %d bytes long, at most %d allowed", kind, len(cid), maxCIDLen)
	case !lock.SafeName(cid):
		return driver.Invalid("%s cid %q may only hold letters, digits, '.', '_' and '-' and must not start with '.' (no paths)", kind, cid)
	}
	return nil
}

func newCID(prefix string) (string, error) {
	id, err := uuid.NewRandom()
	if err != nil {
		return "", err
	}
	return prefix + id.String(), nil
}

func now() string { return time.Now().UTC().Format(time.RFC3339) }

// CalculateVMCloudProperties implements driver.Driver: the local driver
// does not size VMs, it records what was asked.
func (d *Driver) CalculateVMCloudProperties(_ context.Context, r driver.Resources) (driver.Props, error) {
	return driver.PropsOf(vmProps{CPU: r.CPU, RAM: r.RAM, EphemeralDiskSize: r.EphemeralDiskSize}), nil
}
