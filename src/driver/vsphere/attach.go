package vsphere

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"

	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
	"github.com/vmware/govmomi/vmdk"

	"github.com/runway-cpi/runway/src/driver"
)

// AttachDisk attaches the vmdk as an independent persistent disk on the
// system disk's controller. A disk on a datastore the VM's host cannot
// see (or outside the datastores its cid names) is first moved to one it
// can, matching the pattern, as the official CPI.
func (d *Driver) AttachDisk(ctx context.Context, vmCID, diskCID string) (any, error) {
	if _, err := diskName(diskCID); err != nil {
		return nil, err
	}
	vc, vm, release, err := d.lockedVM(ctx, vmCID, "disk-"+lockName(diskCID))
	if err != nil {
		return nil, err
	}
	defer release()
	loc, err := d.findDisk(ctx, vc, diskCID)
	if err != nil {
		return nil, err
	}
	var m mo.VirtualMachine
	if err := vm.Properties(ctx, vm.Reference(), []string{"config.hardware.device", "config.extraConfig"}, &m); err != nil || m.Config == nil {
		return nil, d.cloudErr("read "+vmCID, err)
	}
	devices := object.VirtualDeviceList(m.Config.Hardware.Device)
	if disk := attachedDisk(devices, loc.name); disk != nil {
		return diskHint(m.Config.ExtraConfig, disk), nil // attached already (a retried call)
	}
	if loc, err = d.placeForVM(ctx, vc, vm, loc); err != nil {
		return nil, err
	}
	sys := devices.SelectByType((*types.VirtualDisk)(nil))
	if len(sys) == 0 {
		return nil, fmt.Errorf("vsphere: %s has no system disk to share a controller with", vmCID)
	}
	ctrl := sys[0].GetVirtualDevice().ControllerKey
	unit := freeUnit(devices, ctrl)
	if unit == nil {
		return nil, fmt.Errorf("vsphere: %s's disk controller has no free unit", vmCID)
	}
	disk := &types.VirtualDisk{VirtualDevice: types.VirtualDevice{Key: -1, ControllerKey: ctrl, UnitNumber: unit,
		Backing: &types.VirtualDiskFlatVer2BackingInfo{
			VirtualDeviceFileBackingInfo: types.VirtualDeviceFileBackingInfo{FileName: loc.path, Datastore: &loc.ds.ref},
			DiskMode:                     string(types.VirtualDiskModeIndependent_persistent)}}}
	cfg := types.VirtualMachineConfigSpec{DeviceChange: []types.BaseVirtualDeviceConfigSpec{
		&types.VirtualDeviceConfigSpec{Operation: types.VirtualDeviceConfigSpecOperationAdd, Device: disk}}}
	t, err := vm.Reconfigure(ctx, cfg)
	err = waitTask(ctx, t, err)
	if err != nil {
		return nil, d.cloudErr("attach "+loc.name+" to "+vmCID, err)
	}
	if err := vm.Properties(ctx, vm.Reference(), []string{"config.hardware.device"}, &m); err != nil {
		return nil, d.cloudErr("read "+vmCID, err)
	}
	attached := attachedDisk(object.VirtualDeviceList(m.Config.Hardware.Device), loc.name)
	if attached == nil {
		return nil, fmt.Errorf("vsphere: %s does not show %s after attaching it", vmCID, loc.name)
	}
	d.Log.Info("disk attached", "disk", loc.name, "vm", vmCID, "datastore", loc.ds.name)
	return diskHint(m.Config.ExtraConfig, attached), nil
}

// placeForVM moves the disk to a datastore the VM's host sees when it
// is not on one (or not on one its cid's datastores match).
func (d *Driver) placeForVM(ctx context.Context, vc *vcenter, vm *object.VirtualMachine, loc *diskLoc) (*diskLoc, error) {
	dss, err := d.vmDatastores(ctx, vc, vm)
	if err != nil {
		return nil, err
	}
	seen := false
	for _, ds := range dss {
		seen = seen || ds.ref == loc.ds.ref
	}
	if seen && (loc.hint == nil || loc.hint.match(loc.ds.name)) {
		return loc, nil
	}
	m := patternMatcher(d.cfg.dc().PersistentDatastorePattern)
	if loc.hint != nil {
		m = *loc.hint
	}
	size, err := d.diskBytes(ctx, vc, loc)
	if err != nil {
		return nil, err
	}
	dst, ok := pick(dss, m, size)
	if !ok {
		return nil, noPlacement("moving disk "+loc.name+" where the VM can reach it", m, size, []cluster{{datastores: dss}})
	}
	to := dsPath(dst.name, path.Join(d.cfg.dc().DiskPath, loc.name+".vmdk"))
	if err := d.mkdir(ctx, vc, dsPath(dst.name, d.cfg.dc().DiskPath)); err != nil {
		return nil, err
	}
	d.Log.Info("moving disk where the VM can reach it", "disk", loc.name, "from", loc.ds.name, "to", dst.name)
	// Not retried blindly: moving persistent data twice is not safe.
	t, err := object.NewVirtualDiskManager(vc.c).MoveVirtualDisk(ctx, loc.path, vc.dc, to, vc.dc, false)
	err = waitTask(ctx, t, err)
	if err != nil {
		return nil, d.cloudErr("move disk "+loc.name+" to "+dst.name, err)
	}
	return &diskLoc{name: loc.name, ds: dst, path: to, hint: loc.hint}, nil
}

// diskBytes is a vmdk's capacity, read from its descriptor (vcsim's
// datastore browser leaves capacityKb out; every datastore has the
// descriptor).
func (d *Driver) diskBytes(ctx context.Context, vc *vcenter, loc *diskLoc) (int64, error) {
	_, rel, _ := splitDSPath(loc.path)
	var size int64
	err := d.Retry.Do(ctx, "vsphere read "+loc.name, func(ctx context.Context) error {
		r, _, err := d.datastoreObject(vc, loc.ds).Download(ctx, rel, nil)
		if err != nil {
			return err
		}
		defer r.Close()
		desc, err := vmdk.ParseDescriptor(io.LimitReader(r, 64<<10))
		if err != nil {
			return err
		}
		size = desc.Capacity()
		return nil
	})
	if err != nil {
		return 0, d.cloudErr("read disk "+loc.name, err)
	}
	return size, nil
}

// DetachDisk removes the disk from the VM, keeping the vmdk.
func (d *Driver) DetachDisk(ctx context.Context, vmCID, diskCID string) error {
	name, err := diskName(diskCID)
	if err != nil {
		return err
	}
	vc, vm, release, err := d.lockedVM(ctx, vmCID, "disk-"+lockName(diskCID))
	if err != nil {
		return err
	}
	defer release()
	devices, err := vm.Device(ctx)
	if err != nil {
		return d.cloudErr("read "+vmCID+"'s devices", err)
	}
	disk := attachedDisk(devices, name)
	if disk == nil {
		if _, err := d.findDisk(ctx, vc, diskCID); err != nil {
			return err
		}
		return fmt.Errorf("%w: %s is not attached to %s", driver.ErrDiskNotAttached, name, vmCID)
	}
	if err := d.detach(ctx, vm, []types.BaseVirtualDevice{disk}); err != nil {
		return err
	}
	d.Log.Info("disk detached", "disk", name, "vm", vmCID)
	return nil
}

// ResizeDisk grows a detached vmdk (the Director detaches it first);
// shrinking is refused.
func (d *Driver) ResizeDisk(ctx context.Context, cid string, sizeMiB int) error {
	vc, loc, release, err := d.lockedDisk(ctx, cid)
	if err != nil {
		return err
	}
	defer release()
	size, err := d.diskBytes(ctx, vc, loc)
	if err != nil {
		return err
	}
	want := int64(sizeMiB) << 20
	switch {
	case want < size:
		return fmt.Errorf("%w: resize_disk cannot shrink %s from %d to %d MiB", driver.ErrNotSupported, loc.name, size>>20, sizeMiB)
	case want == size:
		return nil
	}
	t, err := object.NewVirtualDiskManager(vc.c).ExtendVirtualDisk(ctx, loc.path, vc.dc, int64(sizeMiB)*1024, nil)
	err = waitTask(ctx, t, err)
	if err != nil {
		return d.cloudErr("resize disk "+loc.name, err)
	}
	d.Log.Info("disk resized", "disk", loc.name, "mib", sizeMiB)
	return nil
}

// UpdateDisk is not implemented: the Director then resizes with
// resize_disk (or a new disk and a copy).
func (d *Driver) UpdateDisk(context.Context, string, int, driver.Props) (string, error) {
	return "", fmt.Errorf("%w: update_disk (the vsphere driver resizes with resize_disk)", driver.ErrNotImplemented)
}

// isNotFound reports a lookup that found nothing.
func isNotFound(err, sentinel error) bool { return errors.Is(err, sentinel) }
