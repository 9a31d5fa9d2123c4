package vsphere

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path"
	"strings"

	"github.com/vmware/govmomi/fault"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"

	"github.com/runway-cpi/runway/src/driver"
)

// A persistent disk is an independent vmdk, [datastore] <disk_path>/<cid>.vmdk,
// as the official CPI makes it; its cid may carry the official CPI's
// suffix (".<base64 JSON>" naming the datastores it was made for).

// diskLoc is where a disk is.
type diskLoc struct {
	name string // disk-<uuid>
	ds   datastore
	path string // [ds] disk_path/name.vmdk
	hint *matcher
}

// cidHint reads the official CPI's target_datastore_pattern suffix.
func cidHint(cid string) *matcher {
	_, enc, ok := strings.Cut(cid, ".")
	if !ok {
		return nil
	}
	b, err := base64.URLEncoding.DecodeString(enc)
	if err != nil {
		return nil
	}
	var m struct {
		Pattern string `json:"target_datastore_pattern"`
	}
	if json.Unmarshal(b, &m) != nil || m.Pattern == "" {
		return nil
	}
	re, err := compilePattern(m.Pattern)
	if err != nil {
		return nil
	}
	return &matcher{re: re}
}

// dcDatastores are every datastore of the datacenter.
func (d *Driver) dcDatastores(ctx context.Context, vc *vcenter) ([]datastore, error) {
	var dc mo.Datacenter
	if err := vc.pc.RetrieveOne(ctx, vc.dc.Reference(), []string{"datastore"}, &dc); err != nil {
		return nil, d.cloudErr("list datastores", err)
	}
	return d.usableDatastores(ctx, vc, dc.Datastore)
}

// usableDatastores are those of refs that placement may use.
func (d *Driver) usableDatastores(ctx context.Context, vc *vcenter, refs []types.ManagedObjectReference) ([]datastore, error) {
	var dss []datastore
	for _, r := range refs {
		dss = append(dss, datastore{ref: r})
	}
	info, err := d.datastoreInfo(ctx, vc, refs)
	if err != nil {
		return nil, err
	}
	return usable(dss, info), nil
}

// findDisk looks for the disk on the datastores of its hint, then of
// persistent_datastore_pattern, then on the others.
func (d *Driver) findDisk(ctx context.Context, vc *vcenter, cid string) (*diskLoc, error) {
	name, err := diskName(cid)
	if err != nil {
		return nil, err
	}
	dss, err := d.dcDatastores(ctx, vc)
	if err != nil {
		return nil, err
	}
	hint := cidHint(cid)
	persistent := patternMatcher(d.cfg.dc().PersistentDatastorePattern)
	rank := func(ds datastore) int {
		switch {
		case hint != nil && hint.match(ds.name):
			return 0
		case persistent.match(ds.name):
			return 1
		}
		return 2
	}
	vdm := object.NewVirtualDiskManager(vc.c)
	for r := 0; r < 3; r++ {
		for _, ds := range dss {
			if rank(ds) != r {
				continue
			}
			p := dsPath(ds.name, path.Join(d.cfg.dc().DiskPath, name+".vmdk"))
			_, err := vdm.QueryVirtualDiskUuid(ctx, p, vc.dc)
			if err == nil {
				return &diskLoc{name: name, ds: ds, path: p, hint: hint}, nil
			}
			if !notFound(err) && !fault.Is(err, &types.FileFault{}) && !fault.Is(err, &types.InvalidDatastore{}) {
				return nil, d.cloudErr("find disk "+name, err)
			}
		}
	}
	return nil, fmt.Errorf("%w: %s in datacenter %s", driver.ErrDiskNotFound, name, d.cfg.dc().Name)
}

// CreateDisk makes an independent vmdk on a datastore of the cloud
// properties' datastores (or persistent_datastore_pattern) that the VM
// can reach (or any configured cluster, without a VM).
func (d *Driver) CreateDisk(ctx context.Context, spec driver.DiskSpec) (string, error) {
	var p diskProps
	if err := spec.Decode(&p); err != nil {
		return "", err
	}
	t := p.Type
	if t == "" {
		t = d.cfg.DefaultDiskType
	}
	kind, err := diskType(t)
	if err != nil {
		return "", err
	}
	m := patternMatcher(d.cfg.dc().PersistentDatastorePattern)
	for _, n := range p.Datastores {
		m.names = append(m.names, string(n))
	}
	vc, err := d.client(ctx)
	if err != nil {
		return "", err
	}
	var candidates []datastore
	if spec.VMCID != "" {
		_, vm, err := d.vmFor(ctx, spec.VMCID)
		if err != nil {
			return "", err
		}
		if candidates, err = d.vmDatastores(ctx, vc, vm); err != nil {
			return "", err
		}
	} else {
		cs, err := d.clusters(ctx, vc, d.cfg.dc().Clusters)
		if err != nil {
			return "", err
		}
		for _, c := range cs {
			candidates = append(candidates, c.datastores...)
		}
	}
	ds, ok := pick(candidates, m, int64(spec.SizeMiB)<<20)
	if !ok {
		return "", noPlacement("a persistent disk", m, int64(spec.SizeMiB)<<20, []cluster{{datastores: candidates}})
	}
	name := newName("disk")
	p2 := dsPath(ds.name, path.Join(d.cfg.dc().DiskPath, name+".vmdk"))
	if err := d.mkdir(ctx, vc, dsPath(ds.name, d.cfg.dc().DiskPath)); err != nil {
		return "", err
	}
	task, err := object.NewVirtualDiskManager(vc.c).CreateVirtualDisk(ctx, p2, vc.dc, &types.FileBackedVirtualDiskSpec{
		VirtualDiskSpec: types.VirtualDiskSpec{DiskType: kind, AdapterType: string(types.VirtualDiskAdapterTypeLsiLogic)},
		CapacityKb:      int64(spec.SizeMiB) * 1024})
	if err == nil {
		err = task.Wait(ctx)
	}
	if err != nil {
		return "", d.cloudErr("create disk on "+ds.name, err)
	}
	d.Log.Info("disk created", "disk", name, "datastore", ds.name, "mib", spec.SizeMiB, "type", kind)
	return name, nil
}

// mkdir makes a datastore directory (one that exists is fine).
func (d *Driver) mkdir(ctx context.Context, vc *vcenter, p string) error {
	err := object.NewFileManager(vc.c).MakeDirectory(ctx, p, vc.dc, true)
	if err != nil && !fault.Is(err, &types.FileAlreadyExists{}) {
		return d.cloudErr("make directory "+p, err)
	}
	return nil
}

// vmDatastores are the usable datastores the VM's host sees.
func (d *Driver) vmDatastores(ctx context.Context, vc *vcenter, vm *object.VirtualMachine) ([]datastore, error) {
	var m mo.VirtualMachine
	if err := vm.Properties(ctx, vm.Reference(), []string{"runtime.host"}, &m); err != nil || m.Runtime.Host == nil {
		return nil, d.cloudErr("read the VM's host", err)
	}
	var h mo.HostSystem
	if err := vc.pc.RetrieveOne(ctx, *m.Runtime.Host, []string{"datastore"}, &h); err != nil {
		return nil, d.cloudErr("read the host's datastores", err)
	}
	return d.usableDatastores(ctx, vc, h.Datastore)
}

// DeleteDisk deletes the vmdk.
func (d *Driver) DeleteDisk(ctx context.Context, cid string) error {
	vc, loc, release, err := d.lockedDisk(ctx, cid)
	if err != nil {
		return err
	}
	defer release()
	t, err := object.NewVirtualDiskManager(vc.c).DeleteVirtualDisk(ctx, loc.path, vc.dc)
	err = waitTask(ctx, t, err)
	if err != nil && !notFound(err) {
		return d.cloudErr("delete disk "+loc.name, err)
	}
	d.Log.Info("disk deleted", "disk", loc.name)
	return nil
}

// HasDisk reports whether the vmdk exists.
func (d *Driver) HasDisk(ctx context.Context, cid string) (bool, error) {
	if _, err := diskName(cid); err != nil {
		return false, err
	}
	vc, err := d.client(ctx)
	if err != nil {
		return false, err
	}
	_, err = d.findDisk(ctx, vc, cid)
	if isNotFound(err, driver.ErrDiskNotFound) {
		return false, nil
	}
	return err == nil, err
}

// lockedDisk takes the disk's lock and finds it; release is nil when err
// is not (the lock is then already released).
func (d *Driver) lockedDisk(ctx context.Context, cid string) (*vcenter, *diskLoc, func(), error) {
	if _, err := diskName(cid); err != nil {
		return nil, nil, nil, err
	}
	release, err := d.Locks.Lock(ctx, "disk-"+lockName(cid))
	if err != nil {
		return nil, nil, nil, err
	}
	vc, err := d.client(ctx)
	if err != nil {
		release()
		return nil, nil, nil, err
	}
	loc, err := d.findDisk(ctx, vc, cid)
	if err != nil {
		release()
		return nil, nil, nil, err
	}
	return vc, loc, release, nil
}

// lockName is a disk cid without its suffix (lock names are short).
func lockName(cid string) string {
	name, _, _ := strings.Cut(cid, ".")
	return name
}

// persistentDisks are the VM's independent persistent disks.
func persistentDisks(devices object.VirtualDeviceList) []types.BaseVirtualDevice {
	var out []types.BaseVirtualDevice
	for _, dev := range devices.SelectByType((*types.VirtualDisk)(nil)) {
		if b, ok := dev.(*types.VirtualDisk).Backing.(*types.VirtualDiskFlatVer2BackingInfo); ok &&
			b.DiskMode == string(types.VirtualDiskModeIndependent_persistent) {
			out = append(out, dev)
		}
	}
	return out
}

// attachedDisk is the VM's device for the disk, nil when not attached.
func attachedDisk(devices object.VirtualDeviceList, name string) *types.VirtualDisk {
	for _, dev := range persistentDisks(devices) {
		disk := dev.(*types.VirtualDisk)
		b := disk.Backing.(*types.VirtualDiskFlatVer2BackingInfo)
		if strings.HasSuffix(b.FileName, "/"+name+".vmdk") {
			return disk
		}
	}
	return nil
}

// detach removes disk devices from the VM, keeping their files.
func (d *Driver) detach(ctx context.Context, vm *object.VirtualMachine, disks []types.BaseVirtualDevice) error {
	var cfg types.VirtualMachineConfigSpec
	for _, dev := range disks {
		cfg.DeviceChange = append(cfg.DeviceChange, &types.VirtualDeviceConfigSpec{Operation: types.VirtualDeviceConfigSpecOperationRemove, Device: dev})
	}
	t, err := vm.Reconfigure(ctx, cfg)
	err = waitTask(ctx, t, err)
	return d.cloudErr("detach disks", err)
}

// GetDisks lists the VM's persistent disks (their cids, without the
// official CPI's suffix).
func (d *Driver) GetDisks(ctx context.Context, vmCID string) ([]string, error) {
	_, vm, err := d.vmFor(ctx, vmCID)
	if err != nil {
		return nil, err
	}
	devices, err := vm.Device(ctx)
	if err != nil {
		return nil, d.cloudErr("read "+vmCID+"'s devices", err)
	}
	out := []string{}
	for _, dev := range persistentDisks(devices) {
		b := dev.(*types.VirtualDisk).Backing.(*types.VirtualDiskFlatVer2BackingInfo)
		base := strings.TrimSuffix(path.Base(b.FileName), ".vmdk")
		if _, err := diskName(base); err == nil {
			out = append(out, base)
		}
	}
	return out, nil
}
