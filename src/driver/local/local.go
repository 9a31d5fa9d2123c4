// Package local is the embedded default driver: VMs on this host, as
// process groups (package procvm) or OCI containers (package ctrvm), run
// through one interface (isolation.go); everything lives under a state
// dir (package store) and is guarded by cross-process locks. This package
// holds the CPI methods.
package local

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/console"
	"github.com/runway-cpi/runway/src/driver/local/ctrvm"
	"github.com/runway-cpi/runway/src/driver/local/hostnet"
	"github.com/runway-cpi/runway/src/driver/local/procvm"
	"github.com/runway-cpi/runway/src/driver/local/store"
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/logging"
)

// Driver implements driver.Driver on the local host.
type Driver struct {
	cfg Config
	// st is the state dir: its resources, locks and the driver's log.
	st *store.Store
	// ipam is the address table of both isolations.
	ipam *hostnet.IPAM
	// iso is the configured isolation: new VMs and disks get it. isos are
	// all of them, process VMs (whose records name none) first: a VM or
	// disk keeps the one it was made with. idle makes the VMs that run
	// nothing (run_processes off): process VMs without a command.
	iso, idle isolation
	isos      []isolation
}

var _ driver.Complete = (*Driver)(nil)

func init() {
	// Every local key configures the host (its processes, bridge, runtime,
	// shell, limits): a request context may set none of them.
	driver.Register(driver.Registration{Section: config.Section{Name: "local", Config: &Config{}},
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
	p, stateDir, err := c.complete(stateDir)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = logging.Discard()
	}
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("local: the driver's own executable: %w", err)
	}
	st := &store.Store{Root: stateDir, Locks: locks, Log: logging.Fields{Logger: log, Tag: "local"}}
	d := &Driver{cfg: c, st: st}
	// self is the driver's executable: a process VM's console writer, a
	// container VM's supervisor (Supervised).
	procs := &procvm.VMs{Store: st, Self: self, ConsoleMax: d.consoleMax(), Grace: d.grace()}
	on := c.Isolation == IsolationContainer
	ctrs, err := ctrvm.New(ctrvm.Deps{Store: st, Config: c.Container, On: on, Prefix: p,
		Self: self, ConsoleMax: d.consoleMax(), Grace: d.grace()})
	if err != nil {
		return nil, err
	}
	d.iso, d.idle, d.isos = procs, procs, []isolation{procs, ctrs}
	if on {
		d.iso = ctrs
	}
	d.ipam = &hostnet.IPAM{Path: filepath.Join(stateDir, "ipam.json"), Prefix: p, Locks: locks, Alive: st.OwnerAlive, Live: st.LiveVMs,
		Bridge: ctrs.Bridge}
	for _, sub := range []string{"stemcells", "vms", "disks", "snapshots"} {
		if err := os.MkdirAll(filepath.Join(stateDir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("local: state dir: %w", err)
		}
	}
	return d, nil
}

// StemcellFormats implements driver.Driver.
func (d *Driver) StemcellFormats() []string { return d.cfg.StemcellFormats }

// CalculateVMCloudProperties implements driver.Driver: the local driver
// does not size VMs, it records what was asked.
func (d *Driver) CalculateVMCloudProperties(_ context.Context, r driver.Resources) (driver.Props, error) {
	return driver.PropsOf(store.VMProps{CPU: r.CPU, RAM: r.RAM, EphemeralDiskSize: r.EphemeralDiskSize}), nil
}

// consoleMax is the cap of a VM's console.log (and of console.log.1).
func (d *Driver) consoleMax() int64 { return int64(d.cfg.ConsoleMaxKiB) << 10 }

// grace is how long a VM's processes get between SIGTERM and SIGKILL.
func (d *Driver) grace() time.Duration { return time.Duration(d.cfg.StopGraceSeconds) * time.Second }

// release frees a VM's addresses.
func (d *Driver) release(ctx context.Context, cid string) {
	if err := d.ipam.Release(ctx, cid); err != nil {
		d.st.Log.Warn("releasing addresses failed", "vm", cid, "err", err)
	}
}

// Supervised runs what the driver's executable may be started again for
// — a container VM's supervisor, an operation inside a VM's mount
// namespace, a process VM's console writer — and exits; otherwise it
// returns at once. cpi-local's main calls it first thing.
func Supervised() {
	ctrvm.Supervised()
	console.Served()
}
