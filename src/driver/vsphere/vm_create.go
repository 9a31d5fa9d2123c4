package vsphere

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"

	"github.com/vmware/govmomi/fault"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/cloudtags"
	"github.com/runway-cpi/runway/src/driver/netprefix"
)

// CreateVM clones the stemcell's replica on the chosen datastore (a
// linked clone off its "initial" snapshot) with the VM's CPUs, memory,
// ephemeral disk and NICs, writes the agent's env.json and env.iso beside
// it, inserts the ISO and powers it on. planVM decides everything
// (reading, never making); applyVM makes; a failure removes the VM.
func (d *Driver) CreateVM(ctx context.Context, spec driver.VMSpec) (driver.VM, error) {
	pl, err := d.planVM(ctx, spec)
	if err != nil {
		return driver.VM{}, creationErr(err)
	}
	release, err := d.Locks.Lock(ctx, "vm-"+pl.name)
	if err != nil {
		return driver.VM{}, err
	}
	defer release()
	if err := d.applyVM(ctx, pl); err != nil {
		return driver.VM{}, creationErr(err)
	}
	return driver.VM{CID: pl.name, Networks: spec.Networks}, nil
}

// creationErr: input errors stay what they are; anything else is a
// creation failure, retryable when capacity or throttling caused it.
func creationErr(err error) error {
	if errors.Is(err, driver.ErrInvalidInput) || errors.Is(err, driver.ErrNotSupported) ||
		errors.Is(err, driver.ErrStemcellNotFound) || errors.Is(err, context.Canceled) {
		return err
	}
	return &driver.CreationError{Err: err, Retryable: capacity(err)}
}

// vmPlan is what create_vm decided before it makes anything.
type vmPlan struct {
	spec    driver.VMSpec
	name    string
	props   vmProps
	vmx     map[string]string
	nics    []nicPlan
	cluster cluster
	ds      datastore
	vc      *vcenter
}

// nicPlan is one BOSH network's NIC.
type nicPlan struct {
	network string // the BOSH network's name
	pg      string // the port group
	backing types.BaseVirtualDeviceBackingInfo
}

func (d *Driver) planVM(ctx context.Context, spec driver.VMSpec) (*vmPlan, error) {
	pl := &vmPlan{spec: spec, name: spec.Name}
	if pl.name == "" {
		pl.name = newName("vm")
	}
	if err := validVM(pl.name); err != nil {
		return nil, err
	}
	if err := spec.CloudProps.Decode("cloud_properties", &pl.props); err != nil {
		return nil, err
	}
	if err := pl.props.validate(d.cfg); err != nil {
		return nil, err
	}
	if err := validStemcell(spec.StemcellCID); err != nil {
		return nil, err
	}
	pl.vmx = pl.props.vmx(d.cfg)
	vc, err := d.client(ctx)
	if err != nil {
		return nil, err
	}
	pl.vc = vc
	if pl.nics, err = d.planNICs(ctx, vc, spec.Networks); err != nil {
		return nil, err
	}
	if d.cfg.ensureNoIPConflicts() {
		if err := d.checkIPConflicts(ctx, vc, spec.Networks); err != nil {
			return nil, err
		}
	}
	cs, err := d.clusters(ctx, vc, pl.props.clusterRefs(d.cfg))
	if err != nil {
		return nil, err
	}
	near, err := d.diskDatastores(ctx, vc, spec.DiskCIDs)
	if err != nil {
		return nil, err
	}
	m := pl.props.ephemeral(d.cfg)
	need := int64(pl.props.Disk+pl.props.RAM) << 20 // the ephemeral disk and the swap file
	for _, c := range placementOrder(cs, near) {
		if ds, ok := pick(c.datastores, m, need); ok {
			pl.cluster, pl.ds = c, ds
			return pl, nil
		}
	}
	return nil, noPlacement("the VM's ephemeral disk and swap", m, need, cs)
}

// planNICs resolves each network's port group, in network name order.
func (d *Driver) planNICs(ctx context.Context, vc *vcenter, nets driver.Networks) ([]nicPlan, error) {
	names := make([]string, 0, len(nets))
	for n := range nets {
		names = append(names, n)
	}
	sort.Strings(names)
	var out []nicPlan
	for _, n := range names {
		net := nets[n]
		if net.Type == "vip" {
			return nil, fmt.Errorf("%w: networks.%s: vip networks are not supported by the vsphere driver (as the official CPI)", driver.ErrNotSupported, n)
		}
		if err := netprefix.CheckNoDelegation(net, n, "vsphere"); err != nil {
			return nil, err
		}
		var np networkProps
		if err := net.CloudProperties.Decode("networks."+n+".cloud_properties", &np); err != nil {
			return nil, err
		}
		if np.Name == "" {
			return nil, driver.Invalid("networks.%s.cloud_properties.name (the port group) is required", n)
		}
		ref, err := d.network(ctx, vc, np.Name)
		if err != nil {
			return nil, err
		}
		b, err := ref.EthernetCardBackingInfo(ctx)
		if err != nil {
			return nil, d.cloudErr("network "+np.Name, err)
		}
		out = append(out, nicPlan{network: n, pg: np.Name, backing: b})
	}
	return out, nil
}

// checkIPConflicts refuses a manual IP that a VM on the same port group
// already reports (ensure_no_ip_conflicts, as the official CPI).
func (d *Driver) checkIPConflicts(ctx context.Context, vc *vcenter, nets driver.Networks) error {
	si := object.NewSearchIndex(vc.c)
	for n, net := range nets {
		if net.Type == "dynamic" || net.IP == "" {
			continue
		}
		var np networkProps
		_ = net.CloudProperties.Decode("networks."+n+".cloud_properties", &np)
		refs, err := si.FindAllByIp(ctx, vc.dc, net.IP, true)
		if err != nil {
			return d.cloudErr("find VMs by IP", err)
		}
		for _, r := range refs {
			var vm mo.VirtualMachine
			if err := vc.pc.RetrieveOne(ctx, r.Reference(), []string{"name", "guest.net"}, &vm); err != nil {
				continue
			}
			if vm.Guest == nil {
				continue
			}
			for _, nic := range vm.Guest.Net {
				if slices.Contains(nic.IpAddress, net.IP) && nic.Network == lastPart(np.Name) {
					return fmt.Errorf("vsphere: IP conflict: VM %s on network %s already has %s (ensure_no_ip_conflicts)", vm.Name, np.Name, net.IP)
				}
			}
		}
	}
	return nil
}

// placementOrder puts clusters that see a datastore of the VM's disks
// first (locality, as the official CPI), the others shuffled.
func placementOrder(cs []cluster, near []types.ManagedObjectReference) []cluster {
	var first, rest []cluster
	for _, c := range shuffled(cs) {
		if slices.ContainsFunc(c.datastores, func(ds datastore) bool { return slices.Contains(near, ds.ref) }) {
			first = append(first, c)
		} else {
			rest = append(rest, c)
		}
	}
	return append(first, rest...)
}

func shuffled(cs []cluster) []cluster {
	out := slices.Clone(cs)
	rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// applyVM makes the VM; on a failure it removes it.
func (d *Driver) applyVM(ctx context.Context, pl *vmPlan) error {
	vc := pl.vc
	src, snap, err := d.replica(ctx, vc, pl.spec.StemcellCID, pl.cluster, pl.ds)
	if err != nil {
		return err
	}
	devices, err := src.Device(ctx)
	if err != nil {
		return d.cloudErr("read the stemcell's devices", err)
	}
	cfg, err := d.cloneConfig(pl, devices)
	if err != nil {
		return err
	}
	folder, err := d.folder(ctx, vc, d.cfg.dc().VMFolder)
	if err != nil {
		return err
	}
	spec := types.VirtualMachineCloneSpec{
		Location: types.VirtualMachineRelocateSpec{Datastore: &pl.ds.ref, Pool: &pl.cluster.pool,
			DiskMoveType: string(types.VirtualMachineRelocateDiskMoveOptionsCreateNewChildDiskBacking)},
		Snapshot: snap,
	}
	t, err := src.Clone(ctx, folder, pl.name, spec)
	var info *types.TaskInfo
	if err == nil {
		info, err = t.WaitForResult(ctx)
	}
	if err != nil {
		return d.cloudErr("clone "+pl.name, err)
	}
	vm := object.NewVirtualMachine(vc.c, info.Result.(types.ManagedObjectReference))
	d.Log.Info("vm cloned", "vm", pl.name, "cluster", pl.cluster.name, "datastore", pl.ds.name)
	// The hardware as a reconfiguration of the clone, not in the clone
	// spec: vCenter takes both the same way, vcsim only this one.
	if t, err = vm.Reconfigure(ctx, *cfg); err == nil {
		err = t.Wait(ctx)
	}
	if err != nil {
		d.removeVM(context.WithoutCancel(ctx), vc, vm)
		return d.cloudErr("configure "+pl.name, err)
	}
	if err := d.finishVM(ctx, pl, vm); err != nil {
		d.removeVM(context.WithoutCancel(ctx), vc, vm)
		return err
	}
	return nil
}

// finishVM: agent env, hardware version, groups and rules, power on.
func (d *Driver) finishVM(ctx context.Context, pl *vmPlan, vm *object.VirtualMachine) error {
	if err := d.setMetadata(ctx, pl.vc, vm.Reference(), d.creationFields(pl)); err != nil {
		return err
	}
	if err := d.writeEnv(ctx, pl, vm); err != nil {
		return err
	}
	if err := d.upgradeHW(ctx, pl, vm); err != nil {
		return err
	}
	if err := d.groups(ctx, pl, vm); err != nil {
		return err
	}
	t, err := vm.PowerOn(ctx)
	err = waitTask(ctx, t, err)
	return d.cloudErr("power on "+pl.name, err)
}

// creationFields are the custom fields a new VM carries: the creator's
// tags, the networks (list_vms answers by them) and the official CPI's
// cpi_metadata_version.
func (d *Driver) creationFields(pl *vmPlan) map[string]string {
	f := cloudtags.Merge(pl.spec.Tags)
	ips := map[string]string{}
	for n, net := range pl.spec.Networks {
		ips[n] = net.IP
	}
	f[fieldNetworks] = cloudtags.EncodeNames(ips, 4096)
	f[fieldMetadataVersion] = "1"
	return f
}

// Custom fields the driver owns.
const (
	fieldNetworks        = "runway_networks"
	fieldMetadataVersion = "cpi_metadata_version"
)

// upgradeHW sets the hardware version: the host's newest when asked
// (cloud properties over the config), else default_hw_version. A VM at
// that version or newer is left as it is.
func (d *Driver) upgradeHW(ctx context.Context, pl *vmPlan, vm *object.VirtualMachine) error {
	upgrade := d.cfg.UpgradeHWVersion
	if pl.props.UpgradeHWVersion != nil {
		upgrade = *pl.props.UpgradeHWVersion
	}
	version := fmt.Sprintf("vmx-%02d", d.cfg.DefaultHWVersion)
	if upgrade {
		version = ""
	}
	t, err := vm.UpgradeVM(ctx, version)
	err = waitTask(ctx, t, err)
	if err != nil && (fault.Is(err, &types.AlreadyUpgraded{}) || fault.Is(err, &types.NotSupported{})) {
		return nil
	}
	return d.cloudErr("upgrade hardware of "+pl.name, err)
}

// lastPart is a port group path's last element.
func lastPart(p string) string {
	for i := len(p) - 1; i >= 0; i-- {
		if p[i] == '/' {
			return p[i+1:]
		}
	}
	return p
}
