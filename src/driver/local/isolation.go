package local

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/ctrvm"
	"github.com/runway-cpi/runway/src/driver/local/procvm"
	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// isolation is how VMs run: process groups on the host (procvm.VMs) or
// OCI containers (ctrvm.VMs), and the kind of disk each takes. New VMs
// and disks get the configured one; a VM or a disk keeps the one it was
// made with (its record says), so the config may change while it lives
// and deleting it still undoes what made it. Every difference between the
// two is a method here: the Driver never asks which one it has.
type isolation interface {
	// Owns: VM record rec was made by this isolation. OwnsDisk: disk
	// record rec is of the kind this isolation makes.
	Owns(rec *store.VM) bool
	OwnsDisk(rec *store.Disk) bool

	// Check refuses, before anything is made, what this isolation cannot
	// give a VM named cid.
	Check(cid string, props store.VMProps) error
	// Executable checks the VM's command is there to run.
	Executable(stemcell, name string) error
	// UserDataScript is where a user-data script is run from.
	UserDataScript() string
	// NoCommand is what a VM naming no command runs (nil: nothing).
	NoCommand(stemcell string) ([]string, error)
	// AgentProfile: whether a VM gets the BOSH agent's capabilities
	// (bootsAgent: it boots its stemcell's agent).
	AgentProfile(props store.VMProps, bootsAgent bool) (bool, error)

	// Networks are the networks a new VM asks addresses for.
	Networks(want driver.Networks) driver.Networks
	// Prepare fills in a new VM's record (not yet published) what this
	// isolation keeps of it, and answers the agent settings it gets; on
	// failure nothing it took is held.
	Prepare(ctx context.Context, rec *store.VM, agent bool, settings []byte) ([]byte, error)
	// Start runs a published VM; on failure nothing of it runs.
	Start(ctx context.Context, rec store.VM, props store.VMProps, settings []byte, userData string) error
	// Running: the VM runs (or has nothing to run).
	Running(rec *store.VM) bool
	// CanStart refuses, before it is stopped, a VM that could not start
	// again.
	CanStart(rec *store.VM) error
	// Stop ends the VM's processes for certain.
	Stop(ctx context.Context, rec *store.VM) error
	// Restart starts a stopped VM again.
	Restart(ctx context.Context, rec *store.VM, props store.VMProps) error
	// Teardown undoes what Start made, once stopped, before the VM's
	// disks are cleared and its directory removed.
	Teardown(rec *store.VM) error
	// Release gives back what Prepare took beyond the state dir, once the
	// VM is gone but for its directory (or was never published).
	Release(ctx context.Context, rec *store.VM)

	// Takes refuses a disk the VM cannot take.
	Takes(vm *store.VM, disk *store.Disk) error
	// Attach makes a disk (recorded as attached, linked under the VM's
	// disks/) visible to the VM and answers where; Detach takes it away,
	// answering whether the VM still held it and was cut off from it.
	Attach(ctx context.Context, rec *store.VM, disk string) (string, error)
	Detach(ctx context.Context, rec *store.VM, disk string) (cut bool, err error)
	// MakeDisk makes a new disk's content in its staged directory dir,
	// its format recorded in rec.
	MakeDisk(ctx context.Context, rec *store.Disk, dir string) error
	// AwaitFree waits (briefly) until nothing holds the disk any more,
	// else says who does.
	AwaitFree(ctx context.Context, rec *store.Disk) error
	// GrowDisk grows a disk's content to sizeMiB (the record is saved by
	// the caller).
	GrowDisk(ctx context.Context, rec *store.Disk, sizeMiB int) error
	// DiskSize is what a snapshot of the disk takes; CopyDisk copies the
	// disk's content into a snapshot's staged directory tmp.
	DiskSize(rec *store.Disk) (int64, error)
	CopyDisk(ctx context.Context, rec *store.Disk, tmp string, budget *storage.Budget) error

	// ImageIsRootfs: a stemcell's image is a VM's root file system (owners
	// and modes kept), not files a process reads.
	ImageIsRootfs() bool
}

// isoOf is the isolation a VM was made with.
func (d *Driver) isoOf(rec *store.VM) isolation {
	for _, i := range d.isos {
		if i.Owns(rec) {
			return i
		}
	}
	return d.isos[0]
}

// diskIso is the isolation whose kind of disk rec is.
func (d *Driver) diskIso(rec *store.Disk) isolation {
	for _, i := range d.isos {
		if i.OwnsDisk(rec) {
			return i
		}
	}
	return d.isos[0]
}

var (
	_ isolation = (*procvm.VMs)(nil)
	_ isolation = (*ctrvm.VMs)(nil)
)
