package vsphere

import (
	"context"
	"fmt"
	"path"
	"sort"

	"github.com/vmware/govmomi/fault"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/cloudtags"
	"github.com/runway-cpi/runway/src/driver/found"
)

// findVM finds a VM by its cid: at its place in vm_folder first (one
// call), else anywhere in the datacenter (a VM moved by an operator), as
// the official CPI finds VMs by name.
func (d *Driver) findVM(ctx context.Context, vc *vcenter, cid string) (*object.VirtualMachine, error) {
	if err := validVM(cid); err != nil {
		return nil, err
	}
	p := path.Join(vc.dc.InventoryPath, "vm", d.cfg.dc().VMFolder, cid)
	ref, err := object.NewSearchIndex(vc.c).FindByInventoryPath(ctx, p)
	if err != nil {
		return nil, d.cloudErr("find vm "+cid, err)
	}
	if ref != nil {
		return object.NewVirtualMachine(vc.c, ref.Reference()), nil
	}
	folders, err := vc.dc.Folders(ctx)
	if err != nil {
		return nil, d.cloudErr("find vm "+cid, err)
	}
	var vms []mo.VirtualMachine
	if err := vc.retrieve(ctx, folders.VmFolder.Reference(), "VirtualMachine", []string{"name"}, &vms); err != nil {
		return nil, d.cloudErr("find vm "+cid, err)
	}
	for _, vm := range vms {
		if vm.Name == cid {
			return object.NewVirtualMachine(vc.c, vm.Self), nil
		}
	}
	return nil, fmt.Errorf("%w: %s in datacenter %s", driver.ErrVMNotFound, cid, d.cfg.dc().Name)
}

// vmFor connects and finds a VM.
func (d *Driver) vmFor(ctx context.Context, cid string) (*vcenter, *object.VirtualMachine, error) {
	if err := validVM(cid); err != nil {
		return nil, nil, err
	}
	vc, err := d.client(ctx)
	if err != nil {
		return nil, nil, err
	}
	vm, err := d.findVM(ctx, vc, cid)
	return vc, vm, err
}

// HasVM reports whether the VM exists.
func (d *Driver) HasVM(ctx context.Context, cid string) (bool, error) {
	_, _, err := d.vmFor(ctx, cid)
	return found.Answer(err, driver.ErrVMNotFound)
}

// DeleteVM powers the VM off, detaches its persistent disks (they
// outlive it), deletes its env files and destroys it.
func (d *Driver) DeleteVM(ctx context.Context, cid string) error {
	if err := validVM(cid); err != nil {
		return err
	}
	vc, vm, release, err := d.lockedVM(ctx, cid)
	if err != nil {
		return err
	}
	defer release()
	if err := d.powerOff(ctx, vm); err != nil {
		return err
	}
	devices, err := vm.Device(ctx)
	if err != nil {
		return d.cloudErr("read "+cid+"'s devices", err)
	}
	if persistent := persistentDisks(devices); len(persistent) > 0 {
		if err := d.detach(ctx, vm, persistent); err != nil {
			return err
		}
	}
	d.cleanEnv(ctx, vc, vm)
	t, err := vm.Destroy(ctx)
	err = waitTask(ctx, t, err)
	if err != nil && !notFound(err) {
		return d.cloudErr("delete vm "+cid, err)
	}
	d.Log.Info("vm deleted", "vm", cid)
	return nil
}

// powerOff powers a VM off; one already off is fine.
func (d *Driver) powerOff(ctx context.Context, vm *object.VirtualMachine) error {
	var m mo.VirtualMachine
	if err := vm.Properties(ctx, vm.Reference(), []string{"runtime.powerState"}, &m); err != nil {
		return d.cloudErr("read power state", err)
	}
	if m.Runtime.PowerState == types.VirtualMachinePowerStatePoweredOff {
		return nil
	}
	return d.powerTask(ctx, "power off", vm.PowerOff)
}

// RebootVM asks the guest to reboot; when its tools cannot, the VM is
// powered off and on (as the official CPI).
func (d *Driver) RebootVM(ctx context.Context, cid string) error {
	_, vm, err := d.vmFor(ctx, cid)
	if err != nil {
		return err
	}
	if err := vm.RebootGuest(ctx); err == nil {
		return nil
	} else {
		d.Log.Info("soft reboot failed: powering off and on", "vm", cid, "err", err)
	}
	if err := d.powerOff(ctx, vm); err != nil {
		return err
	}
	return d.powerOn(ctx, vm)
}

func (d *Driver) powerOn(ctx context.Context, vm *object.VirtualMachine) error {
	return d.powerTask(ctx, "power on", vm.PowerOn)
}

// lockedVM takes the VM's lock, then those of more (attach and detach
// hold the disk's too), and finds the VM; release is nil when err is
// not (every lock is then released).
func (d *Driver) lockedVM(ctx context.Context, cid string, more ...string) (*vcenter, *object.VirtualMachine, func(), error) {
	var unlocks []func()
	release := func() {
		for i := len(unlocks) - 1; i >= 0; i-- {
			unlocks[i]()
		}
	}
	for _, name := range append([]string{"vm-" + cid}, more...) {
		unlock, err := d.Locks.Lock(ctx, name)
		if err != nil {
			release()
			return nil, nil, nil, err
		}
		unlocks = append(unlocks, unlock)
	}
	vc, vm, err := d.vmFor(ctx, cid)
	if err != nil {
		release()
		return nil, nil, nil, err
	}
	return vc, vm, release, nil
}

// folderVMs are the VMs in the folder at path, with props read.
func (d *Driver) folderVMs(ctx context.Context, vc *vcenter, path, what string, props ...string) ([]mo.VirtualMachine, error) {
	folder, err := d.folder(ctx, vc, path)
	if err != nil {
		return nil, err
	}
	var vms []mo.VirtualMachine
	if err := vc.retrieve(ctx, folder.Reference(), "VirtualMachine", props, &vms); err != nil {
		return nil, d.cloudErr(what, err)
	}
	return vms, nil
}

// waitTask waits for the task t when starting it did not fail (err).
func waitTask(ctx context.Context, t *object.Task, err error) error {
	if err != nil {
		return err
	}
	return t.Wait(ctx)
}

// powerTask runs a power task to its end; a VM already in the state
// asked for is fine.
func (d *Driver) powerTask(ctx context.Context, what string, start func(context.Context) (*object.Task, error)) error {
	t, err := start(ctx)
	err = waitTask(ctx, t, err)
	if err != nil && !fault.Is(err, &types.InvalidPowerState{}) {
		return d.cloudErr(what, err)
	}
	return nil
}

// StopVM powers the VM off, keeping it.
func (d *Driver) StopVM(ctx context.Context, cid string) error {
	_, vm, err := d.vmFor(ctx, cid)
	if err != nil {
		return err
	}
	return d.powerOff(ctx, vm)
}

// StartVM powers the VM on.
func (d *Driver) StartVM(ctx context.Context, cid string) error {
	_, vm, err := d.vmFor(ctx, cid)
	if err != nil {
		return err
	}
	return d.powerOn(ctx, vm)
}

// SetVMMetadata sets each key as a custom field of the VM (as the
// official CPI; a field it may not define is logged and skipped).
func (d *Driver) SetVMMetadata(ctx context.Context, cid string, md map[string]string) error {
	vc, vm, err := d.vmFor(ctx, cid)
	if err != nil {
		return err
	}
	return d.setMetadata(ctx, vc, vm.Reference(), md)
}

// setMetadata sets custom fields, defining the missing ones.
func (d *Driver) setMetadata(ctx context.Context, vc *vcenter, ref types.ManagedObjectReference, md map[string]string) error {
	if len(md) == 0 {
		return nil
	}
	cfm, err := object.GetCustomFieldsManager(vc.c)
	if err != nil {
		return d.cloudErr("custom fields", err)
	}
	defs, err := cfm.Field(ctx)
	if err != nil {
		return d.cloudErr("custom fields", err)
	}
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		key, ok := fieldKey(defs, k)
		if !ok {
			def, err := cfm.Add(ctx, k, "VirtualMachine", nil, nil)
			switch {
			case fault.Is(err, &types.DuplicateName{}):
				if defs, err = cfm.Field(ctx); err == nil {
					key, ok = fieldKey(defs, k)
				}
			case fault.Is(err, &types.NoPermission{}):
				d.Log.Warn("no permission to define a custom field: skipped", "field", k)
				continue
			case err == nil:
				key, ok = def.Key, true
			}
			if !ok {
				return d.cloudErr("define custom field "+k, err)
			}
		}
		if err := cfm.Set(ctx, ref, key, md[k]); err != nil {
			if fault.Is(err, &types.NoPermission{}) {
				d.Log.Warn("no permission to set a custom field: skipped", "field", k)
				continue
			}
			return d.cloudErr("set custom field "+k, err)
		}
	}
	return nil
}

func fieldKey(defs object.CustomFieldDefList, name string) (int32, bool) {
	for _, f := range defs {
		if f.Name == name && (f.ManagedObjectType == "" || f.ManagedObjectType == "VirtualMachine") {
			return f.Key, true
		}
	}
	return 0, false
}

// ListVMs lists the VMs in vm_folder whose custom fields carry every
// tag in match.
func (d *Driver) ListVMs(ctx context.Context, match map[string]string) ([]driver.VMInfo, error) {
	vc, err := d.client(ctx)
	if err != nil {
		return nil, err
	}
	vms, err := d.folderVMs(ctx, vc, d.cfg.dc().VMFolder, "list vms", "name", "customValue", "runtime.powerState")
	if err != nil {
		return nil, err
	}
	cfm, err := object.GetCustomFieldsManager(vc.c)
	if err != nil {
		return nil, d.cloudErr("custom fields", err)
	}
	defs, err := cfm.Field(ctx)
	if err != nil {
		return nil, d.cloudErr("custom fields", err)
	}
	names := map[int32]string{}
	for _, f := range defs {
		names[f.Key] = f.Name
	}
	var out []driver.VMInfo
	for _, vm := range vms {
		if validVM(vm.Name) != nil {
			continue
		}
		info := vmInfo(vm, names)
		if matches(info.Tags, match) {
			out = append(out, info)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].CID < out[j].CID })
	return out, nil
}

func vmInfo(vm mo.VirtualMachine, names map[int32]string) driver.VMInfo {
	info := driver.VMInfo{CID: vm.Name, Tags: map[string]string{}, Networks: driver.Networks{}, State: "unknown"}
	for _, cv := range vm.CustomValue {
		v, ok := cv.(*types.CustomFieldStringValue)
		name := names[cv.GetCustomFieldValue().Key]
		if !ok || name == "" {
			continue
		}
		switch name {
		case fieldNetworks:
			for n, ip := range cloudtags.DecodeNames(v.Value) {
				info.Networks[n] = driver.Network{IP: ip}
			}
		case fieldMetadataVersion:
		default:
			info.Tags[name] = v.Value
		}
	}
	info.Metadata = info.Tags
	info.AgentID = info.Tags["agent_id"]
	switch vm.Runtime.PowerState {
	case types.VirtualMachinePowerStatePoweredOn:
		info.State = "running"
	case types.VirtualMachinePowerStatePoweredOff, types.VirtualMachinePowerStateSuspended:
		info.State = "stopped"
	}
	return info
}

func matches(tags, match map[string]string) bool {
	for k, v := range match {
		if tags[k] != v {
			return false
		}
	}
	return true
}

// CalculateVMCloudProperties answers cpu, ram and disk (the ephemeral
// disk's MiB), as the official CPI.
func (d *Driver) CalculateVMCloudProperties(_ context.Context, r driver.Resources) (driver.Props, error) {
	if r.CPU <= 0 || r.RAM <= 0 || r.EphemeralDiskSize <= 0 {
		return driver.Props{}, driver.Invalid("cpu, ram and ephemeral_disk_size must be positive (got %d, %d, %d)", r.CPU, r.RAM, r.EphemeralDiskSize)
	}
	return driver.PropsOf(map[string]int{"cpu": r.CPU, "ram": r.RAM, "disk": r.EphemeralDiskSize}), nil
}
