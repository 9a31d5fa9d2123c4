package local

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/procs"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// Owns: a container VM's record says so.
func (containerVMs) Owns(rec *store.VM) bool { return rec.Isolation == IsolationContainer }

// OwnsDisk: a container VM's disk is an ext4 image.
func (containerVMs) OwnsDisk(rec *store.Disk) bool { return rec.Format == store.DiskFormatExt4 }

// AgentProfile: whether a VM gets the BOSH agent's capabilities. Only
// the driver's config can allow them (a request's context cannot set
// local keys); cloud properties asking without it are refused by name.
func (v containerVMs) AgentProfile(p store.VMProps, bootsAgent bool) (bool, error) {
	allowed := v.d.cfg.Container.BoshAgent
	switch {
	case p.BoshAgent == nil:
		return allowed && bootsAgent, nil
	case *p.BoshAgent && !allowed:
		return false, driver.Invalid("cloud_properties.bosh_agent: the agent profile is not allowed here: the driver's config must allow it (local.container.bosh_agent: true)")
	}
	return *p.BoshAgent, nil
}

// Networks: every container VM has its address (callers such as the
// orchestrator name no network).
func (containerVMs) Networks(want driver.Networks) driver.Networks {
	if len(want) == 0 {
		return driver.Networks{"default": {Type: "dynamic"}}
	}
	return want
}

// Prepare gives a new VM its host ids, its bridge port and the way its
// stemcell takes disks, and its addresses in its agent settings.
func (v containerVMs) Prepare(ctx context.Context, rec *store.VM, agent bool, settings []byte) ([]byte, error) {
	ids, err := v.d.allocateIDs(ctx, rec.CID)
	if err != nil {
		return nil, err
	}
	fail := func(err error) ([]byte, error) {
		v.d.releaseIDs(ctx, rec.CID)
		return nil, err
	}
	port, err := newPort()
	if err != nil {
		return fail(err)
	}
	mounts, err := v.d.st.DiskMountsOf(rec.StemcellCID)
	if err != nil {
		return fail(err)
	}
	if mounts == store.DiskMountsBind {
		mounts = "" // what VMs made before the choice have
	}
	rec.Isolation, rec.IDs, rec.Port, rec.Agent, rec.OwnDirs, rec.DiskMounts = IsolationContainer, &ids, port, agent, agent, mounts
	return withAddresses(settings, rec.Networks), nil
}

// Running: its supervisor runs.
func (v containerVMs) Running(rec *store.VM) bool {
	return len(procs.LiveMembers(procs.ReadPGID(v.d.st.Dir(store.VMs, rec.CID)), rec.CID)) > 0
}

// Release gives the VM's host ids back.
func (v containerVMs) Release(ctx context.Context, rec *store.VM) {
	if rec.IDs != nil {
		v.d.releaseIDs(ctx, rec.CID)
	}
}

// Takes: either kind of disk (a mount-service VM's attach refuses a
// directory).
func (containerVMs) Takes(*store.VM, *store.Disk) error { return nil }

func (containerVMs) ImageIsRootfs() bool { return true }
