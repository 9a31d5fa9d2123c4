package vsphere

import (
	"context"
	"fmt"
	"slices"
	"sort"

	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"
)

// ephemeralFile is the ephemeral disk's file in the VM's directory, by
// the official CPI's name (its get_disks and delete_vm know it by it).
const ephemeralFile = "ephemeral_disk.vmdk"

// scsiUnitSelf is the SCSI controller's own unit number.
const scsiUnitSelf = 7

// cloneConfig is the clone's configuration: size, options, the SCSI
// controller type, the ephemeral disk and the NICs (the stemcell's own
// NICs removed).
func (d *Driver) cloneConfig(pl *vmPlan, devices object.VirtualDeviceList) (*types.VirtualMachineConfigSpec, error) {
	p := pl.props
	cfg := &types.VirtualMachineConfigSpec{NumCPUs: int32(p.CPU), MemoryMB: int64(p.RAM)}
	locked := d.cfg.MemoryReservationLockedToMax
	if p.MemoryReservationLockedToMax != nil {
		locked = *p.MemoryReservationLockedToMax
	}
	if locked {
		cfg.MemoryReservationLockedToMax = types.NewBool(true)
	}
	if p.NestedHardwareVirtualization {
		cfg.NestedHVEnabled = types.NewBool(true)
	}
	if p.CPUHotAddEnabled {
		cfg.CpuHotAddEnabled = types.NewBool(true)
	}
	if p.MemoryHotAddEnabled {
		cfg.MemoryHotAddEnabled = types.NewBool(true)
	}
	keys := make([]string, 0, len(pl.vmx))
	for k := range pl.vmx {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		cfg.ExtraConfig = append(cfg.ExtraConfig, &types.OptionValue{Key: k, Value: pl.vmx[k]})
	}
	disks := devices.SelectByType((*types.VirtualDisk)(nil))
	if len(disks) == 0 {
		return nil, fmt.Errorf("vsphere: stemcell %s has no disk", pl.spec.StemcellCID)
	}
	sys := disks[0].(*types.VirtualDisk)
	if ch := d.controllerChange(devices, sys.ControllerKey); ch != nil {
		cfg.DeviceChange = append(cfg.DeviceChange, ch)
	}
	eph := &types.VirtualDisk{
		VirtualDevice: types.VirtualDevice{Key: -100, ControllerKey: sys.ControllerKey, UnitNumber: freeUnit(devices, sys.ControllerKey),
			Backing: &types.VirtualDiskFlatVer2BackingInfo{
				VirtualDeviceFileBackingInfo: types.VirtualDeviceFileBackingInfo{FileName: dsPath(pl.ds.name, pl.name+"/"+ephemeralFile), Datastore: &pl.ds.ref},
				DiskMode:                     string(types.VirtualDiskModePersistent), ThinProvisioned: types.NewBool(d.cfg.DefaultDiskType == "thin")}},
		CapacityInKB: int64(p.Disk) * 1024,
	}
	cfg.DeviceChange = append(cfg.DeviceChange, &types.VirtualDeviceConfigSpec{Operation: types.VirtualDeviceConfigSpecOperationAdd,
		FileOperation: types.VirtualDeviceConfigSpecFileOperationCreate, Device: eph})
	for _, nic := range devices.SelectByType((*types.VirtualEthernetCard)(nil)) {
		cfg.DeviceChange = append(cfg.DeviceChange, &types.VirtualDeviceConfigSpec{Operation: types.VirtualDeviceConfigSpecOperationRemove, Device: nic})
	}
	for i, n := range pl.nics {
		card, err := devices.CreateEthernetCard("vmxnet3", n.backing)
		if err != nil {
			return nil, fmt.Errorf("vsphere: NIC for %s: %w", n.network, err)
		}
		card.GetVirtualDevice().Key = int32(-200 - i)
		cfg.DeviceChange = append(cfg.DeviceChange, &types.VirtualDeviceConfigSpec{Operation: types.VirtualDeviceConfigSpecOperationAdd, Device: card})
	}
	return cfg, nil
}

// controllerChange swaps the system disk's SCSI controller for
// default_scsi_controller_type's (an edit of the same key, as the
// official CPI); nil when it already is that type.
func (d *Driver) controllerChange(devices object.VirtualDeviceList, key int32) types.BaseVirtualDeviceConfigSpec {
	dev := devices.FindByKey(key)
	old, ok := dev.(types.BaseVirtualSCSIController)
	if !ok {
		return nil
	}
	base := *old.GetVirtualSCSIController()
	var repl types.BaseVirtualDevice
	switch d.cfg.DefaultSCSIControllerType {
	case "paravirtual":
		if _, same := dev.(*types.ParaVirtualSCSIController); same {
			return nil
		}
		repl = &types.ParaVirtualSCSIController{VirtualSCSIController: base}
	case "lsi_logic":
		if _, same := dev.(*types.VirtualLsiLogicController); same {
			return nil
		}
		repl = &types.VirtualLsiLogicController{VirtualSCSIController: base}
	case "lsi_logic_sas":
		if _, same := dev.(*types.VirtualLsiLogicSASController); same {
			return nil
		}
		repl = &types.VirtualLsiLogicSASController{VirtualSCSIController: base}
	}
	return &types.VirtualDeviceConfigSpec{Operation: types.VirtualDeviceConfigSpecOperationEdit, Device: repl}
}

// freeUnit is the lowest unit number free on a SCSI controller.
func freeUnit(devices object.VirtualDeviceList, controller int32) *int32 {
	used := map[int32]bool{scsiUnitSelf: true}
	for _, dev := range devices {
		v := dev.GetVirtualDevice()
		if v.ControllerKey == controller && v.UnitNumber != nil {
			used[*v.UnitNumber] = true
		}
	}
	for u := int32(0); u < 64; u++ {
		if !used[u] {
			return &u
		}
	}
	return nil
}

// groups puts the VM into its vm_group and, with
// enable_auto_anti_affinity_drs_rules, into its instance group's
// anti-affinity rule (named after env.bosh.group).
func (d *Driver) groups(ctx context.Context, pl *vmPlan, vm *object.VirtualMachine) error {
	group := boshGroup(pl.spec.Env)
	rule := d.cfg.EnableAutoAntiAffinityDRSRules && group != ""
	if pl.props.VMGroup == "" && !rule {
		return nil
	}
	release, err := d.Locks.Lock(ctx, "drs-"+pl.cluster.ref.Value)
	if err != nil {
		return err
	}
	defer release()
	var c mo.ClusterComputeResource
	cl := object.NewClusterComputeResource(pl.vc.c, pl.cluster.ref)
	if err := pl.vc.pc.RetrieveOne(ctx, pl.cluster.ref, []string{"configurationEx"}, &c); err != nil {
		return d.cloudErr("read cluster "+pl.cluster.name, err)
	}
	cfg, _ := c.ConfigurationEx.(*types.ClusterConfigInfoEx)
	if cfg == nil {
		cfg = &types.ClusterConfigInfoEx{}
	}
	spec := &types.ClusterConfigSpecEx{}
	if pl.props.VMGroup != "" {
		spec.GroupSpec = []types.ClusterGroupSpec{vmGroupSpec(cfg, pl.props.VMGroup, vm.Reference())}
	}
	if rule {
		spec.RulesSpec = []types.ClusterRuleSpec{ruleSpec(cfg, group, vm.Reference())}
	}
	t, err := cl.Reconfigure(ctx, spec, true)
	err = waitTask(ctx, t, err)
	return d.cloudErr("add "+pl.name+" to DRS groups of "+pl.cluster.name, err)
}

func vmGroupSpec(cfg *types.ClusterConfigInfoEx, name string, vm types.ManagedObjectReference) types.ClusterGroupSpec {
	for _, g := range cfg.Group {
		if vg, ok := g.(*types.ClusterVmGroup); ok && vg.Name == name {
			vg.Vm = append(vg.Vm, vm)
			return types.ClusterGroupSpec{ArrayUpdateSpec: types.ArrayUpdateSpec{Operation: types.ArrayUpdateOperationEdit}, Info: vg}
		}
	}
	return types.ClusterGroupSpec{ArrayUpdateSpec: types.ArrayUpdateSpec{Operation: types.ArrayUpdateOperationAdd},
		Info: &types.ClusterVmGroup{ClusterGroupInfo: types.ClusterGroupInfo{Name: name}, Vm: []types.ManagedObjectReference{vm}}}
}

func ruleSpec(cfg *types.ClusterConfigInfoEx, name string, vm types.ManagedObjectReference) types.ClusterRuleSpec {
	for _, r := range cfg.Rule {
		if ar, ok := r.(*types.ClusterAntiAffinityRuleSpec); ok && ar.Name == name {
			ar.Vm = append(ar.Vm, vm)
			return types.ClusterRuleSpec{ArrayUpdateSpec: types.ArrayUpdateSpec{Operation: types.ArrayUpdateOperationEdit}, Info: ar}
		}
	}
	return types.ClusterRuleSpec{ArrayUpdateSpec: types.ArrayUpdateSpec{Operation: types.ArrayUpdateOperationAdd},
		Info: &types.ClusterAntiAffinityRuleSpec{ClusterRuleInfo: types.ClusterRuleInfo{Name: name, Enabled: types.NewBool(true)},
			Vm: []types.ManagedObjectReference{vm}}}
}

// boshGroup is env.bosh.group (director-deployment-instance group).
func boshGroup(env map[string]any) string {
	b, _ := env["bosh"].(map[string]any)
	g, _ := b["group"].(string)
	return g
}

// removeVM powers a VM off, removes its env files and destroys it.
func (d *Driver) removeVM(ctx context.Context, vc *vcenter, vm *object.VirtualMachine) {
	if t, err := vm.PowerOff(ctx); err == nil {
		_ = t.Wait(ctx)
	}
	d.cleanEnv(ctx, vc, vm)
	d.destroy(ctx, vm)
}

// diskDatastores are the datastores holding the given disks (for locality).
func (d *Driver) diskDatastores(ctx context.Context, vc *vcenter, cids []string) ([]types.ManagedObjectReference, error) {
	var out []types.ManagedObjectReference
	for _, cid := range cids {
		f, err := d.findDisk(ctx, vc, cid)
		if err != nil {
			continue // attach_disk will say what is wrong with it
		}
		out = append(out, f.ds.ref)
	}
	return slices.Clip(out), nil
}
