package vsphere

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"path"
	"strconv"
	"strings"

	"github.com/kdomanski/iso9660"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// The agent's settings, as the official CPI hands them over: env.json and
// env.iso (one file, "env", holding the JSON) in the VM's directory, the
// ISO in the VM's CD-ROM, and the same JSON base64 in guestinfo.userdata
// for stemcells whose agent reads cloud-init's source.
const (
	envJSON = "env.json"
	envISO  = "env.iso"
)

// writeEnv completes the settings with what only the made VM knows (its
// id, each network's MAC, the disks' unit numbers or UUIDs), writes the
// files and inserts the ISO.
func (d *Driver) writeEnv(ctx context.Context, pl *vmPlan, vm *object.VirtualMachine) error {
	devices, err := vm.Device(ctx)
	if err != nil {
		return d.cloudErr("read "+pl.name+"'s devices", err)
	}
	settings, err := d.agentSettings(pl, vm, devices)
	if err != nil {
		return err
	}
	iso, err := envImage(settings)
	if err != nil {
		return err
	}
	ds := d.datastoreObject(pl.vc, pl.ds)
	for name, body := range map[string][]byte{envJSON: settings, envISO: iso} {
		p := pl.name + "/" + name
		err := d.Retry.Do(ctx, "vsphere upload "+name, func(ctx context.Context) error {
			up := soap.DefaultUpload
			up.ContentLength = int64(len(body))
			return ds.Upload(ctx, bytes.NewReader(body), p, &up)
		})
		if err != nil {
			return d.cloudErr("upload "+name+" of "+pl.name, err)
		}
	}
	cfg := types.VirtualMachineConfigSpec{ExtraConfig: guestinfo(pl, settings)}
	ch, err := cdromChange(devices, dsPath(pl.ds.name, pl.name+"/"+envISO), pl.ds.ref)
	if err != nil {
		return err
	}
	cfg.DeviceChange = []types.BaseVirtualDeviceConfigSpec{ch}
	t, err := vm.Reconfigure(ctx, cfg)
	err = waitTask(ctx, t, err)
	return d.cloudErr("insert env.iso into "+pl.name, err)
}

// guestinfo is what cloud-init's VMware source reads: the agent settings,
// or a caller's own user data (garm's runner install, env.user_data, as
// the other drivers take it) with the metadata cloud-init then needs.
func guestinfo(pl *vmPlan, settings []byte) []types.BaseOptionValue {
	b64 := base64.StdEncoding.EncodeToString
	ud, ok := pl.spec.Env["user_data"].(string)
	if !ok {
		return []types.BaseOptionValue{
			&types.OptionValue{Key: "guestinfo.userdata", Value: b64(settings)},
			&types.OptionValue{Key: "guestinfo.userdata.encoding", Value: "base64"},
		}
	}
	md, _ := json.Marshal(map[string]string{"instance-id": pl.name, "local-hostname": pl.name})
	return []types.BaseOptionValue{
		&types.OptionValue{Key: "guestinfo.userdata", Value: b64([]byte(ud))},
		&types.OptionValue{Key: "guestinfo.userdata.encoding", Value: "base64"},
		&types.OptionValue{Key: "guestinfo.metadata", Value: b64(md)},
		&types.OptionValue{Key: "guestinfo.metadata.encoding", Value: "base64"},
	}
}

// agentSettings is the JSON the agent reads: the CPI's settings (or, for
// a stemcell API v1 caller, the same built here) with vm, MACs and disks.
func (d *Driver) agentSettings(pl *vmPlan, vm *object.VirtualMachine, devices object.VirtualDeviceList) ([]byte, error) {
	s := map[string]any{}
	if len(pl.spec.AgentSettings) > 0 {
		if err := json.Unmarshal(pl.spec.AgentSettings, &s); err != nil {
			return nil, fmt.Errorf("vsphere: agent settings: %w", err)
		}
	} else {
		s["agent_id"] = pl.spec.AgentID
		s["env"] = pl.spec.Env
	}
	s["vm"] = map[string]any{"name": pl.name, "id": vm.Reference().Value}
	nets := map[string]any{}
	if raw, err := json.Marshal(pl.spec.Networks); err == nil {
		_ = json.Unmarshal(raw, &nets)
	}
	if existing, ok := s["networks"].(map[string]any); ok {
		nets = existing
	}
	macs, err := nicMACs(devices, pl.nics)
	if err != nil {
		return nil, err
	}
	for n, mac := range macs {
		if m, ok := nets[n].(map[string]any); ok {
			m["mac"] = mac
		}
	}
	s["networks"] = nets
	disks, err := diskEnv(devices, diskUUIDs(pl.vmx))
	if err != nil {
		return nil, err
	}
	s["disks"] = disks
	return json.Marshal(s)
}

// nicMACs pairs each planned NIC with a NIC of the VM on its port group.
func nicMACs(devices object.VirtualDeviceList, nics []nicPlan) (map[string]string, error) {
	cards := devices.SelectByType((*types.VirtualEthernetCard)(nil))
	used := map[int32]bool{}
	out := map[string]string{}
	for _, n := range nics {
		found := false
		for _, c := range cards {
			card := c.(types.BaseVirtualEthernetCard).GetVirtualEthernetCard()
			if used[card.Key] || !sameBacking(card.Backing, n.backing) {
				continue
			}
			used[card.Key], out[n.network], found = true, card.MacAddress, true
			break
		}
		if !found {
			return nil, fmt.Errorf("vsphere: the VM has no NIC on %s for network %s", n.pg, n.network)
		}
	}
	return out, nil
}

func sameBacking(a, b types.BaseVirtualDeviceBackingInfo) bool {
	switch x := a.(type) {
	case *types.VirtualEthernetCardNetworkBackingInfo:
		y, ok := b.(*types.VirtualEthernetCardNetworkBackingInfo)
		return ok && x.DeviceName == y.DeviceName
	case *types.VirtualEthernetCardDistributedVirtualPortBackingInfo:
		y, ok := b.(*types.VirtualEthernetCardDistributedVirtualPortBackingInfo)
		return ok && x.Port.PortgroupKey == y.Port.PortgroupKey
	case *types.VirtualEthernetCardOpaqueNetworkBackingInfo:
		y, ok := b.(*types.VirtualEthernetCardOpaqueNetworkBackingInfo)
		return ok && x.OpaqueNetworkId == y.OpaqueNetworkId
	}
	return false
}

// diskEnv is the settings' disks: the system and ephemeral disks by unit
// number, or the ephemeral disk by UUID when disk.enableUUID is on.
func diskEnv(devices object.VirtualDeviceList, byUUID bool) (map[string]any, error) {
	var sys, eph *types.VirtualDisk
	for _, dev := range devices.SelectByType((*types.VirtualDisk)(nil)) {
		disk := dev.(*types.VirtualDisk)
		b, _ := disk.Backing.(*types.VirtualDiskFlatVer2BackingInfo)
		switch {
		case b != nil && strings.HasSuffix(b.FileName, "/"+ephemeralFile):
			eph = disk
		case sys == nil:
			sys = disk
		}
	}
	if sys == nil || eph == nil || sys.UnitNumber == nil || eph.UnitNumber == nil {
		return nil, fmt.Errorf("vsphere: the VM lacks its system or ephemeral disk")
	}
	return map[string]any{"system": unitHint(sys, false), "ephemeral": unitHint(eph, byUUID), "persistent": map[string]any{}}, nil
}

// diskHint is what the agent finds a persistent disk by: its UUID when
// the VM has disk.enableUUID, else its unit number (as the official CPI).
func diskHint(extra []types.BaseOptionValue, disk *types.VirtualDisk) any {
	byUUID := false
	for _, o := range extra {
		if ov := o.GetOptionValue(); ov.Key == "disk.enableUUID" && diskUUIDs(map[string]string{ov.Key: fmt.Sprint(ov.Value)}) {
			byUUID = true
		}
	}
	return unitHint(disk, byUUID)
}

// unitHint is a disk's hint in the agent's settings: {"id": uuid} when
// byUUID and the disk has one, else its unit number.
func unitHint(disk *types.VirtualDisk, byUUID bool) any {
	if b, ok := disk.Backing.(*types.VirtualDiskFlatVer2BackingInfo); ok && byUUID && b.Uuid != "" {
		return map[string]any{"id": strings.ToLower(b.Uuid)}
	}
	if disk.UnitNumber == nil {
		return "0"
	}
	return strconv.Itoa(int(*disk.UnitNumber))
}

// envImage is an ISO9660 image holding one file, "env" (what the agent's
// CD-ROM settings source reads; Linux shows the image's ENV;1 as env).
func envImage(settings []byte) ([]byte, error) {
	w, err := iso9660.NewWriter()
	if err != nil {
		return nil, fmt.Errorf("vsphere: env.iso: %w", err)
	}
	defer func() { _ = w.Cleanup() }()
	if err := w.AddFile(bytes.NewReader(settings), "env"); err != nil {
		return nil, fmt.Errorf("vsphere: env.iso: %w", err)
	}
	var b bytes.Buffer
	if err := w.WriteTo(&b, "ENV"); err != nil {
		return nil, fmt.Errorf("vsphere: env.iso: %w", err)
	}
	return b.Bytes(), nil
}

// cdromChange points the VM's CD-ROM at the ISO (connected at power on,
// not by the guest), or adds one on the IDE controller.
func cdromChange(devices object.VirtualDeviceList, iso string, ds types.ManagedObjectReference) (types.BaseVirtualDeviceConfigSpec, error) {
	op := types.VirtualDeviceConfigSpecOperationEdit
	cd, err := devices.FindCdrom("")
	if err != nil {
		ide, ierr := devices.FindIDEController("")
		if ierr != nil {
			return nil, fmt.Errorf("vsphere: the stemcell has neither a CD-ROM nor an IDE controller for one: %w", ierr)
		}
		if cd, err = devices.CreateCdrom(ide); err != nil {
			return nil, fmt.Errorf("vsphere: CD-ROM: %w", err)
		}
		op = types.VirtualDeviceConfigSpecOperationAdd
	}
	cd.Backing = &types.VirtualCdromIsoBackingInfo{VirtualDeviceFileBackingInfo: types.VirtualDeviceFileBackingInfo{FileName: iso, Datastore: &ds}}
	cd.Connectable = &types.VirtualDeviceConnectInfo{StartConnected: true, Connected: true, AllowGuestControl: false}
	return &types.VirtualDeviceConfigSpec{Operation: op, Device: cd}, nil
}

// datastoreObject is a datastore with the paths uploads need.
func (d *Driver) datastoreObject(vc *vcenter, ds datastore) *object.Datastore {
	o := object.NewDatastore(vc.c, ds.ref)
	o.DatacenterPath = vc.dc.InventoryPath
	o.InventoryPath = path.Join(vc.dc.InventoryPath, "datastore", ds.name)
	return o
}

// cleanEnv deletes the VM's env.json and env.iso (best effort: a
// storage-vMotioned VM's files may be elsewhere).
func (d *Driver) cleanEnv(ctx context.Context, vc *vcenter, vm *object.VirtualMachine) {
	devices, err := vm.Device(ctx)
	if err != nil {
		return
	}
	cd, err := devices.FindCdrom("")
	if err != nil {
		return
	}
	b, ok := cd.Backing.(*types.VirtualCdromIsoBackingInfo)
	if !ok || !strings.HasSuffix(b.FileName, "/"+envISO) {
		return
	}
	dir := strings.TrimSuffix(b.FileName, envISO)
	fm := object.NewFileManager(vc.c)
	for _, f := range []string{envJSON, envISO} {
		t, err := fm.DeleteDatastoreFile(ctx, dir+f, vc.dc)
		err = waitTask(ctx, t, err)
		if err != nil && !notFound(err) {
			d.Log.Info("could not delete the VM's env file", "file", dir+f, "err", err)
		}
	}
}
