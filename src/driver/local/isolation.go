package local

import (
	"context"
	"strings"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// isolation is how VMs run: process groups on the host (processVMs) or
// OCI containers (containerVMs). New VMs get the configured one; a VM
// keeps the one it was made with (vm.json's isolation), so the config may
// change while it lives and deleting it still undoes what made it.
type isolation interface {
	// check refuses, before anything is made, what this isolation cannot
	// give a VM named cid.
	check(cid string, props store.VMProps) error
	// executable checks the VM's command is there to run.
	executable(stemcell, name string) error
	// userDataScript is where a user-data script is run from.
	userDataScript() string
	// noCommand is what a VM naming no command runs (nil: nothing).
	noCommand(stemcell string) ([]string, error)
	// start runs a published VM; on failure nothing of it runs.
	start(ctx context.Context, rec store.VM, props store.VMProps, settings []byte, userData string) error
	// stop ends the VM's processes for certain.
	stop(ctx context.Context, rec *store.VM) error
	// teardown undoes what start made, once stopped, before the VM's
	// directory is removed.
	teardown(rec *store.VM) error
	// restart starts a stopped VM again.
	restart(ctx context.Context, rec *store.VM, props store.VMProps) error
	// attach makes a disk (recorded as attached, linked under the VM's
	// disks/) visible to the VM and answers where; detach takes it away,
	// answering whether the VM still held it and was cut off from it.
	attach(ctx context.Context, rec *store.VM, disk string) (string, error)
	detach(ctx context.Context, rec *store.VM, disk string) (cut bool, err error)
}

// iso is the isolation new VMs get.
func (d *Driver) iso() isolation {
	if d.containers() {
		return containerVMs{d}
	}
	return processVMs{d}
}

// isoOf is the isolation a VM was made with.
func (d *Driver) isoOf(rec *store.VM) isolation {
	if rec.Isolation == IsolationContainer {
		return containerVMs{d}
	}
	return processVMs{d}
}

// processVMs: a VM is a detached process group on the host, in its
// directory, with no isolation from the host beyond its user's.
type processVMs struct{ d *Driver }

func (p processVMs) check(_ string, props store.VMProps) error {
	if props.BoshAgent != nil && *props.BoshAgent {
		return driver.Invalid(`cloud_properties.bosh_agent needs local.isolation "container" (a process VM cannot host an agent)`)
	}
	return nil
}

func (processVMs) executable(_, name string) error { return findExecutable(name) }

func (processVMs) userDataScript() string { return "./user-data" }

func (processVMs) noCommand(string) ([]string, error) { return nil, nil }

func (p processVMs) start(_ context.Context, rec store.VM, props store.VMProps, _ []byte, _ string) error {
	if len(rec.Command) == 0 {
		return nil
	}
	if err := startProcess(p.d.st.Dir(store.VMs, rec.CID), rec.Command, p.d.processEnv(rec, props), p.d.self, p.d.consoleMax()); err != nil {
		return err
	}
	p.d.st.Log.Info("vm started", "vm", rec.CID, "command", strings.Join(redactArgv(rec.Command), " "))
	return nil
}

func (p processVMs) stop(ctx context.Context, rec *store.VM) error {
	if len(rec.Command) == 0 { // a VM without a command never had a process
		return nil
	}
	return stopVM(ctx, rec.CID, readPGID(p.d.st.Dir(store.VMs, rec.CID)), p.d.grace())
}

func (processVMs) teardown(*store.VM) error { return nil }

func (p processVMs) restart(ctx context.Context, rec *store.VM, props store.VMProps) error {
	if len(rec.Command) == 0 {
		return nil
	}
	if err := startProcess(p.d.st.Dir(store.VMs, rec.CID), rec.Command, p.d.processEnv(*rec, props), p.d.self, p.d.consoleMax()); err != nil {
		return err
	}
	p.d.st.Log.Info("vm restarted", "vm", rec.CID)
	return nil
}

// attach: the disk is the link in the VM's directory.
func (p processVMs) attach(_ context.Context, rec *store.VM, disk string) (string, error) {
	return p.d.st.DiskLink(rec.CID, disk), nil
}

func (processVMs) detach(context.Context, *store.VM, string) (bool, error) { return false, nil }
