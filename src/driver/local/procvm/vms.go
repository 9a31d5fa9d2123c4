// Package procvm runs the local driver's process VMs: a VM is a detached
// process group on the host, in its directory, with no isolation from the
// host beyond its user's; its disks are directories. VMs implements the
// Driver's isolation interface.
package procvm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/procs"
	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// VMs are process VMs: what the Driver hands them.
type VMs struct {
	Store *store.Store
	// Self is the driver's executable: the console writer at the end of
	// each VM's output pipe (console.Served).
	Self string
	// ConsoleMax caps a VM's console.log (bytes); Grace is the time
	// between SIGTERM and SIGKILL.
	ConsoleMax int64
	Grace      time.Duration
}

// Owns: a process VM's record names no isolation.
func (*VMs) Owns(rec *store.VM) bool { return rec.Isolation == "" }

// OwnsDisk: a process VM's disk is a directory (no format).
func (*VMs) OwnsDisk(rec *store.Disk) bool { return rec.Format == "" }

func (p *VMs) Check(_ string, props store.VMProps) error {
	if props.BoshAgent != nil && *props.BoshAgent {
		return driver.Invalid(`cloud_properties.bosh_agent needs local.isolation "container" (a process VM cannot host an agent)`)
	}
	return nil
}

func (*VMs) Executable(_, name string) error { return findExecutable(name) }

func (*VMs) UserDataScript() string { return "./user-data" }

func (*VMs) NoCommand(string) ([]string, error) { return nil, nil }

// AgentProfile: a process VM has none (Check refuses asking for it).
func (*VMs) AgentProfile(store.VMProps, bool) (bool, error) { return false, nil }

func (*VMs) Networks(want driver.Networks) driver.Networks { return want }

func (*VMs) Prepare(_ context.Context, _ *store.VM, _ bool, settings []byte) ([]byte, error) {
	return settings, nil
}

func (p *VMs) Start(_ context.Context, rec store.VM, props store.VMProps, _ []byte, _ string) error {
	return p.run(rec, props, "vm started", "command", strings.Join(redactArgv(rec.Command), " "))
}

// run starts the VM's command, if it has one.
func (p *VMs) run(rec store.VM, props store.VMProps, msg string, kv ...any) error {
	if len(rec.Command) == 0 {
		return nil
	}
	if err := startProcess(p.Store.Dir(store.VMs, rec.CID), rec.Command, p.env(rec, props), p.Self, p.ConsoleMax); err != nil {
		return err
	}
	p.Store.Log.Info(msg, append([]any{"vm", rec.CID}, kv...)...)
	return nil
}

// Running: a VM without a command has nothing to run.
func (p *VMs) Running(rec *store.VM) bool {
	return len(rec.Command) == 0 || len(procs.LiveMembers(procs.ReadPGID(p.Store.Dir(store.VMs, rec.CID)), rec.CID)) > 0
}

func (*VMs) CanStart(*store.VM) error { return nil }

func (p *VMs) Stop(ctx context.Context, rec *store.VM) error {
	if len(rec.Command) == 0 { // a VM without a command never had a process
		return nil
	}
	return procs.Stop(ctx, rec.CID, procs.ReadPGID(p.Store.Dir(store.VMs, rec.CID)), p.Grace)
}

func (*VMs) Teardown(*store.VM) error { return nil }

func (*VMs) Release(context.Context, *store.VM) {}

func (p *VMs) Restart(_ context.Context, rec *store.VM, props store.VMProps) error {
	return p.run(*rec, props, "vm restarted")
}

// Takes: a file system image is mounted, which a process VM cannot.
func (p *VMs) Takes(vm *store.VM, disk *store.Disk) error {
	if !p.OwnsDisk(disk) {
		return fmt.Errorf("disk %s is a file system image, made in container mode: attach it to a container vm (vm %s is a process vm)", disk.CID, vm.CID)
	}
	return nil
}

// Attach: the disk is the link in the VM's directory.
func (p *VMs) Attach(_ context.Context, rec *store.VM, disk string) (string, error) {
	return p.Store.DiskLink(rec.CID, disk), nil
}

func (*VMs) Detach(context.Context, *store.VM, string) (bool, error) { return false, nil }

// MakeDisk: the data dir is the disk's root inside a VM (/var/vcap/store):
// 0755, as a fresh file system's root, so the jobs' users can reach their
// directories on it. The disk's own directory stays 0700.
func (*VMs) MakeDisk(_ context.Context, _ *store.Disk, dir string) error {
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
		return err
	}
	return os.Chmod(filepath.Join(dir, "data"), 0o755)
}

// AwaitFree: a directory is never held.
func (*VMs) AwaitFree(context.Context, *store.Disk) error { return nil }

// GrowDisk: a directory's size is only recorded.
func (*VMs) GrowDisk(context.Context, *store.Disk, int) error { return nil }

func (p *VMs) DiskSize(rec *store.Disk) (int64, error) {
	return storage.TreeSize(filepath.Join(p.Store.Dir(store.Disks, rec.CID), "data"))
}

// CopyDisk copies the directory's files one by one.
func (p *VMs) CopyDisk(ctx context.Context, rec *store.Disk, tmp string, budget *storage.Budget) error {
	return storage.CopyTree(ctx, filepath.Join(p.Store.Dir(store.Disks, rec.CID), "data"), filepath.Join(tmp, "data"), budget)
}

func (*VMs) ImageIsRootfs() bool { return false }
