// Package ctrvm runs the local driver's container VMs: each VM an OCI
// container made from a rootfs stemcell (package container: its runtime
// config and supervisor), in user, mount, network and cgroup namespaces
// of its own, with host ids from the host's registry, a writable layer
// and disks of ext4 images, an address on the bridge (package hostnet),
// its file systems mounted in its supervisor's mount namespace, the
// mount service its agent may ask (package mountsvc). VMs implements the
// Driver's isolation interface.
package ctrvm

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/agentprofile"
	"github.com/runway-cpi/runway/src/driver/local/container"
	"github.com/runway-cpi/runway/src/driver/local/hostnet"
	"github.com/runway-cpi/runway/src/driver/local/procs"
	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// VMs are container VMs.
type VMs struct {
	st  *store.Store
	cfg Config
	// on: the configured isolation (local.isolation "container"); a VM
	// made in container mode starts only then, though it can always be
	// deleted.
	on         bool
	self       string
	consoleMax int64
	grace      time.Duration
	// Bridge is the VMs' network (nil unless on): the address table holds
	// a manual address to it.
	Bridge *hostnet.Bridge
}

// Deps is what the Driver hands container VMs.
type Deps struct {
	Store *store.Store
	// Config is the local.container section, completed (Config.Complete)
	// when On.
	Config Config
	// On: container VMs are the configured isolation; Prefix is then the
	// bridge's network.
	On     bool
	Prefix netip.Prefix
	// Self is the driver's executable: a VM's supervisor, operations
	// inside a VM's mount namespace. ConsoleMax caps a VM's console.log
	// (bytes); Grace is the time between SIGTERM and SIGKILL.
	Self       string
	ConsoleMax int64
	Grace      time.Duration
}

// New makes container VMs; when on, the host's ids are checked against
// container.uid_base and the bridge named.
func New(d Deps) (*VMs, error) {
	v := &VMs{st: d.Store, cfg: d.Config, on: d.On, self: d.Self, consoleMax: d.ConsoleMax, grace: d.Grace}
	if !d.On {
		return v, nil
	}
	if err := checkHostIDs(d.Config.UIDBase, readHostIDFiles()); err != nil {
		return nil, err
	}
	v.Bridge = &hostnet.Bridge{Name: d.Config.Bridge, Prefix: d.Prefix, Key: v.stateKey(), Record: filepath.Join(v.st.Root, "bridge.json"),
		NAT: d.Config.NAT, AllowVMToVM: d.Config.AllowVMToVM, Locks: v.st.Locks}
	return v, nil
}

// Check: the CID is the VM's hostname; what it asks stays within the
// operator's maxima.
func (v *VMs) Check(cid string, props store.VMProps) error {
	if len(cid) >= maxHostname {
		return driver.Invalid("vm cid %q is too long for a container's hostname (at most %d bytes)", cid, maxHostname-1)
	}
	cc := v.cfg
	if props.RAM > cc.MaxRAMMiB {
		return driver.Invalid("cloud_properties.ram: %d MiB is more than a vm may have here (local.container.max_ram_mib: %d)", props.RAM, cc.MaxRAMMiB)
	}
	if props.CPU > cc.MaxCPU {
		return driver.Invalid("cloud_properties.cpu: %d is more than a vm may have here (local.container.max_cpu: %d)", props.CPU, cc.MaxCPU)
	}
	if props.RAM < 0 || props.CPU < 0 {
		return driver.Invalid("cloud_properties.ram and cpu: must not be negative")
	}
	if props.EphemeralDiskSize != 0 && props.EphemeralDiskSize < MinEphemeralDiskMiB {
		return driver.Invalid("cloud_properties.ephemeral_disk_size: %d MiB is too small for the vm's file system (at least %d)", props.EphemeralDiskSize, MinEphemeralDiskMiB)
	}
	return nil
}

// Executable looks for the command in the stemcell's image.
func (v *VMs) Executable(stemcell, name string) error {
	return findExecutableIn(v.st.ImageDir(stemcell), name)
}

// UserDataScript: where the agent's user data is, inside the VM.
func (*VMs) UserDataScript() string { return container.UserDataPath }

// NoCommand: the stemcell's own init, as the warden CPI starts it.
func (v *VMs) NoCommand(stemcell string) ([]string, error) {
	if err := findExecutableIn(v.st.ImageDir(stemcell), agentprofile.Init); err != nil {
		return nil, &driver.CreationError{Err: fmt.Errorf("the vm has no command (cloud_properties.command or user_data) and stemcell %s has no %s to start its agent: %w", stemcell, agentprofile.Init, err)}
	}
	return agentprofile.Boot, nil
}

// Start makes and starts a published container VM.
func (v *VMs) Start(ctx context.Context, rec store.VM, props store.VMProps, settings []byte, userData string) error {
	if err := v.prepareContainer(ctx, rec, props, rec.Command); err != nil {
		return err
	}
	if err := v.Bridge.Ensure(ctx); err != nil {
		return err
	}
	if err := v.ctr(rec.CID).launch(rec, props).Run(ctx); err != nil {
		return err
	}
	v.st.Log.Info("vm started in a container", "vm", rec.CID)
	return nil
}

// CanStart: a container VM starts only where container VMs are on.
func (v *VMs) CanStart(rec *store.VM) error {
	if !v.on {
		return fmt.Errorf("vm %s was made in container mode: starting it needs local.isolation \"container\" (deleting it does not)", rec.CID)
	}
	return nil
}

// Restart starts a stopped VM again: its ids claimed again, the bridge
// made again if it went (a host restarted).
func (v *VMs) Restart(ctx context.Context, rec *store.VM, props store.VMProps) error {
	if rec.IDs == nil {
		return errNoUserNS(rec.CID)
	}
	if err := v.claimIDs(ctx, rec); err != nil {
		return err
	}
	if err := v.Bridge.Ensure(ctx); err != nil {
		return err
	}
	if err := v.ctr(rec.CID).launch(*rec, props).Run(ctx); err != nil {
		return err
	}
	v.st.Log.Info("vm restarted", "vm", rec.CID)
	return nil
}

// Stop ends a container VM for certain: SIGTERM reaches the VM's PID 1
// through its supervisor, SIGKILL follows after the grace; then the
// runtime's forced delete, and whatever is left in the VM's cgroups (a
// runtime killed part-way through a create) is killed and removed.
func (v *VMs) Stop(ctx context.Context, rec *store.VM) error {
	c := v.ctr(rec.CID)
	pgid := procs.ReadPGID(c.dir)
	handled, err := procs.StopLeader(ctx, rec.CID, pgid, v.grace)
	if !handled {
		err = procs.Stop(ctx, rec.CID, pgid, v.grace)
	}
	// The supervisor deletes its container as it ends; one it could not
	// (killed) is still in the runtime's state.
	if _, serr := os.Stat(filepath.Join(v.runtime().Root, c.id())); serr == nil {
		_, _ = v.runtime().Run(ctx, "delete", "--force", c.id())
	}
	if cerr := container.KillCgroups(ctx, rec.CID, c.cgroup()); cerr != nil {
		return cerr
	}
	if err != nil || pgid > 1 {
		return err
	}
	// A supervisor found by marker only (create killed part-way) may have
	// started a runtime meanwhile: look once more.
	return procs.Stop(ctx, rec.CID, 0, v.grace)
}

// Teardown undoes what prepareContainer and the network set up, after the
// VM is stopped: the host end of the veth, then every mount under the
// VM's directory, innermost first. It fails rather than leave a mount
// (removing the directory with a disk still mounted would delete the
// disk's data).
func (v *VMs) Teardown(rec *store.VM) error {
	c := v.ctr(rec.CID)
	if err := hostnet.DeleteLink(c.hostIf(rec)); err != nil {
		return err
	}
	if err := v.retirePort(rec); err != nil {
		return fmt.Errorf("removing vm %s from the bridge ports' guard: %w", rec.CID, err)
	}
	// What the driver mounted, by name (the mount table grows with every
	// VM); then every mount below, by device, else by the mount table.
	var mps []string
	for _, devs := range []string{c.devs(), filepath.Join(c.dir, "devs")} {
		if ents, err := os.ReadDir(devs); err == nil {
			for _, e := range ents {
				mps = append(mps, filepath.Join(devs, e.Name()))
			}
		}
	}
	mps = append(mps, c.devs(), c.rootfs(), filepath.Join(c.run(), "image"), filepath.Join(c.run(), "layer"),
		filepath.Join(c.dir, "devs"), filepath.Join(c.dir, "rootfs")) // the last two: VMs made before /run/runway
	if err := storage.Unmount(mps...); err != nil {
		return err
	}
	for _, dir := range []string{c.run(), c.dir} {
		if storage.NoMountsIn(dir, 2) != nil {
			if err := storage.UnmountAll(dir); err != nil {
				return err
			}
		}
		// Belt and braces before the directory is removed: a mount the
		// mount table did not show under this path (a symlinked state
		// dir) would have another device.
		if err := storage.NoMountsIn(dir, 2); err != nil {
			return fmt.Errorf("not removing vm %s: %w", c.cid, err)
		}
	}
	if err := os.RemoveAll(c.run()); err != nil {
		return err
	}
	_ = os.Remove(filepath.Dir(c.run())) // the state dir's, once its last VM is gone
	return nil
}

// Attach records the disk in the VM's agent settings, as the warden CPI
// does, and mounts it into the VM if it runs (else it is mounted when
// it starts).
func (v *VMs) Attach(ctx context.Context, rec *store.VM, disk string) (string, error) {
	inside := container.DisksDir + "/" + disk
	if err := v.updateDiskSettings(rec.CID, disk, inside); err != nil {
		return "", fmt.Errorf("recording disk %s in vm %s's agent settings: %w", disk, rec.CID, err)
	}
	if _, err := v.inVM(ctx, rec, "attach", disk); err != nil {
		return "", err
	}
	return inside, nil
}

// Detach takes the disk out of the VM if it runs (it disappears inside at
// once, from every mount namespace of the VM) and out of its agent
// settings.
func (v *VMs) Detach(ctx context.Context, rec *store.VM, disk string) (bool, error) {
	if err := v.updateDiskSettings(rec.CID, disk, ""); err != nil {
		return false, fmt.Errorf("removing disk %s from vm %s's agent settings: %w", disk, rec.CID, err)
	}
	out, err := v.inVM(ctx, rec, "detach", disk)
	return strings.Contains(out, cutOff), err
}

// retirePort hands the VM's port to the ports' guard for removal (in a
// batch; at once when it was the state dir's last VM).
func (v *VMs) retirePort(rec *store.VM) error {
	var addrs []string
	for _, n := range rec.Networks {
		if n.IP != "" {
			addrs = append(addrs, n.IP)
		}
	}
	last := true
	entries, _ := os.ReadDir(filepath.Join(v.st.Root, "vms"))
	for _, e := range entries {
		if e.Name() != rec.CID && !strings.HasPrefix(e.Name(), ".") {
			last = false
			break
		}
	}
	key := v.stateKey()
	r := hostnet.Retired{Path: filepath.Join(v.st.Root, "guard-retired.json"), Table: hostnet.GuardTable(key), Locks: v.st.Locks}
	return r.Retire(context.Background(), v.ctr(rec.CID).hostIf(rec), hostnet.VMMAC(key, rec.CID), addrs, last)
}

// Owns: a container VM's record says so.
func (*VMs) Owns(rec *store.VM) bool { return rec.Isolation == Isolation }

// OwnsDisk: a container VM's disk is an ext4 image.
func (*VMs) OwnsDisk(rec *store.Disk) bool { return rec.Format == store.DiskFormatExt4 }

// AgentProfile: whether a VM gets the BOSH agent's capabilities. Only
// the driver's config can allow them (a request's context cannot set
// local keys); cloud properties asking without it are refused by name.
func (v *VMs) AgentProfile(p store.VMProps, bootsAgent bool) (bool, error) {
	allowed := v.cfg.BoshAgent
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
func (*VMs) Networks(want driver.Networks) driver.Networks {
	if len(want) == 0 {
		return driver.Networks{"default": {Type: "dynamic"}}
	}
	return want
}

// Prepare gives a new VM its host ids, its bridge port and the way its
// stemcell takes disks, and its addresses in its agent settings.
func (v *VMs) Prepare(ctx context.Context, rec *store.VM, agent bool, settings []byte) ([]byte, error) {
	ids, err := v.allocateIDs(ctx, rec.CID)
	if err != nil {
		return nil, err
	}
	fail := func(err error) ([]byte, error) {
		v.releaseIDs(ctx, rec.CID)
		return nil, err
	}
	port, err := newPort()
	if err != nil {
		return fail(err)
	}
	mounts, err := v.st.DiskMountsOf(rec.StemcellCID)
	if err != nil {
		return fail(err)
	}
	if mounts == store.DiskMountsBind {
		mounts = "" // what VMs made before the choice have
	}
	rec.Isolation, rec.IDs, rec.Port, rec.Agent, rec.OwnDirs, rec.DiskMounts = Isolation, &ids, port, agent, agent, mounts
	return withAddresses(settings, rec.Networks), nil
}

// Running: its supervisor runs.
func (v *VMs) Running(rec *store.VM) bool {
	return len(procs.LiveMembers(procs.ReadPGID(v.st.Dir(store.VMs, rec.CID)), rec.CID)) > 0
}

// Release gives the VM's host ids back.
func (v *VMs) Release(ctx context.Context, rec *store.VM) {
	if rec.IDs != nil {
		v.releaseIDs(ctx, rec.CID)
	}
}

// Takes: either kind of disk (a mount-service VM's attach refuses a
// directory).
func (*VMs) Takes(*store.VM, *store.Disk) error { return nil }

func (*VMs) ImageIsRootfs() bool { return true }
