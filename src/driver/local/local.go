// Package local is the embedded default driver: VMs are supervised local
// process groups, disks are directories, everything lives under a state
// dir and is guarded by cross-process locks.
package local

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/hostnet"
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/logging"
)

// Driver implements driver.Driver on the local host.
type Driver struct {
	cfg    Config
	prefix netip.Prefix
	root   string
	locks  *lock.Locker
	log    logging.Fields
	// bridge is container mode's VM network (nil in process mode); ipam
	// the address table of both modes.
	bridge *hostnet.Bridge
	ipam   *hostnet.IPAM
	// self is the driver's executable: a process VM's console writer and
	// a container VM's supervisor (console.Served, container.Supervised).
	self string
}

var _ driver.Complete = (*Driver)(nil)

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
	d := &Driver{cfg: c, prefix: p, root: stateDir, locks: locks, log: logging.Fields{Logger: log, Tag: "local"}, self: self}
	d.ipam = &hostnet.IPAM{Path: filepath.Join(stateDir, "ipam.json"), Prefix: p, Locks: locks, Alive: d.ownerAlive, Live: d.liveVMs}
	if d.containers() {
		cc := c.Container
		if err := checkHostIDs(cc.UIDBase, readHostIDFiles()); err != nil {
			return nil, err
		}
		d.bridge = &hostnet.Bridge{Name: cc.Bridge, Prefix: p, Key: d.stateKey(), Record: filepath.Join(stateDir, "bridge.json"),
			NAT: cc.NAT, AllowVMToVM: cc.AllowVMToVM, Locks: locks}
		d.ipam.Bridge = d.bridge
	}
	for _, sub := range []string{"stemcells", "vms", "disks", "snapshots"} {
		if err := os.MkdirAll(filepath.Join(stateDir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("local: state dir: %w", err)
		}
	}
	return d, nil
}

// StemcellFormats implements driver.Driver.
func (d *Driver) StemcellFormats() []string { return d.cfg.StemcellFormats }

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

// ownerAlive: a VM being created or existing still owns its addresses.
// The checks follow the publishing rename (.creating-<cid> → <cid>): looked
// at in the other order, a VM published between the two looks dead.
func (d *Driver) ownerAlive(cid string) bool {
	for _, p := range []string{filepath.Join(d.root, "vms", ".creating-"+cid), d.path(vms, cid)} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// consoleMax is the cap of a VM's console.log (and of console.log.1).
func (d *Driver) consoleMax() int64 { return int64(d.cfg.ConsoleMaxKiB) << 10 }

// liveVMs are the VMs published or being created, by one read of vms/:
// what looks dead here is asked again of ownerAlive (a VM published
// during the read may be missed by it).
func (d *Driver) liveVMs() map[string]bool {
	entries, _ := os.ReadDir(filepath.Join(d.root, vms.dir))
	live := make(map[string]bool, len(entries))
	for _, e := range entries {
		live[strings.TrimPrefix(e.Name(), ".creating-")] = true
	}
	return live
}

// release frees a VM's addresses.
func (d *Driver) release(ctx context.Context, cid string) {
	if err := d.ipam.Release(ctx, cid); err != nil {
		d.log.Warn("releasing addresses failed", "vm", cid, "err", err)
	}
}
