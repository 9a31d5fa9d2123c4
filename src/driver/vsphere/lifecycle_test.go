package vsphere

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/kdomanski/iso9660"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"

	"github.com/runway-cpi/runway/src/driver"
)

// made is what a test reads back of a VM, through the driver's session.
type made struct {
	vm      mo.VirtualMachine
	devices object.VirtualDeviceList
	pool    string
	folder  string
}

func inspect(t *testing.T, d *Driver, cid string) made {
	t.Helper()
	vc, vm, err := d.vmFor(bg, cid)
	if err != nil {
		t.Fatal(err)
	}
	var m made
	if err := vm.Properties(bg, vm.Reference(), []string{"config", "runtime", "resourcePool", "parent", "customValue"}, &m.vm); err != nil {
		t.Fatal(err)
	}
	m.devices = m.vm.Config.Hardware.Device
	var rp mo.ResourcePool
	if err := vc.pc.RetrieveOne(bg, *m.vm.ResourcePool, []string{"name"}, &rp); err != nil {
		t.Fatal(err)
	}
	var f mo.Folder
	if err := vc.pc.RetrieveOne(bg, *m.vm.Parent, []string{"name"}, &f); err != nil {
		t.Fatal(err)
	}
	m.pool, m.folder = rp.Name, f.Name
	return m
}

// readEnv downloads the VM's env.iso and reads the file "env" in it as
// the agent does.
func readEnv(t *testing.T, d *Driver, m made) map[string]any {
	t.Helper()
	cd, err := m.devices.FindCdrom("")
	if err != nil {
		t.Fatal(err)
	}
	b := cd.Backing.(*types.VirtualCdromIsoBackingInfo)
	if !cd.Connectable.StartConnected || cd.Connectable.AllowGuestControl {
		t.Errorf("cd-rom connect info %+v: want connected at power on, not by the guest", cd.Connectable)
	}
	ds, rel, _ := splitDSPath(b.FileName)
	vc, _ := d.client(bg)
	var dsRef types.ManagedObjectReference
	for _, r := range m.vm.Datastore {
		dsRef = r
	}
	r, _, err := d.datastoreObject(vc, datastore{ref: dsRef, name: ds}).Download(bg, rel, &soap.DefaultDownload)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(r)
	r.Close()
	img, err := iso9660.OpenImage(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("env.iso is not an ISO9660 image: %v", err)
	}
	root, err := img.RootDir()
	if err != nil {
		t.Fatal(err)
	}
	kids, err := root.GetChildren()
	if err != nil || len(kids) != 1 {
		t.Fatalf("env.iso holds %d files (%v), want one", len(kids), err)
	}
	// Linux's iso9660 (map=normal) shows "env;1" as "env", the name the
	// agent's CD-ROM settings source reads.
	if name := strings.ToLower(strings.TrimSuffix(kids[0].Name(), ";1")); name != "env" {
		t.Fatalf("env.iso's file is %q, want env", kids[0].Name())
	}
	body, _ := io.ReadAll(kids[0].Reader())
	var env map[string]any
	if err := json.Unmarshal(body, &env); err != nil {
		t.Fatalf("env: %v: %s", err, body)
	}
	return env
}

func extra(m made, key string) string {
	for _, o := range m.vm.Config.ExtraConfig {
		if ov := o.GetOptionValue(); ov.Key == key {
			return ov.Value.(string)
		}
	}
	return ""
}

// A VM as the Director makes one: its hardware, placement, NICs, disks,
// and the agent's settings on the CD-ROM and in guestinfo.
func TestCreateVMAsTheOfficialCPI(t *testing.T) {
	sim := newSim(t)
	d := sim.newDriver(t, map[string]any{"vmx_options": map[string]any{"sched.mem.maxmemctl": "1330"}})
	sc := testStemcell(t, d)
	settings := []byte(`{"agent_id":"a1","vm":{"name":"x"},"ntp":["n"],"networks":{"default":{"type":"manual","ip":"10.0.0.20"}},"disks":{"system":"/dev/sda"},"env":{"bosh":{"group":"d-g"}}}`)
	props := smallVM(map[string]any{"cpu": 2, "ram": 1024, "cpu_hot_add_enabled": true, "memory_hot_add_enabled": true,
		"nested_hardware_virtualization": true, "vmx_options": map[string]any{"disk.enableUUID": "1"},
		"datacenters": []any{map[string]any{"name": "DC0", "clusters": []any{map[string]any{"DC0_C1": map[string]any{"resource_pool": "DC0_C1_RP1"}}}}}})
	vm, err := d.CreateVM(bg, driver.VMSpec{AgentID: "a1", StemcellCID: sc, CloudProps: props,
		Networks: manualNet("10.0.0.20", "DC0_DVPG0"), AgentSettings: settings, Tags: map[string]string{"director": "d"}})
	if err != nil {
		t.Fatal(err)
	}
	m := inspect(t, d, vm.CID)
	hw := m.vm.Config.Hardware
	if hw.NumCPU != 2 || hw.MemoryMB != 1024 || !*m.vm.Config.CpuHotAddEnabled || !*m.vm.Config.MemoryHotAddEnabled || !*m.vm.Config.NestedHVEnabled {
		t.Errorf("hardware %d CPUs %d MiB, hot add %v/%v, nested %v", hw.NumCPU, hw.MemoryMB, *m.vm.Config.CpuHotAddEnabled,
			*m.vm.Config.MemoryHotAddEnabled, *m.vm.Config.NestedHVEnabled)
	}
	if m.pool != "DC0_C1_RP1" || m.folder != "BOSH_VMs" {
		t.Errorf("placed in pool %q folder %q; want DC0_C1_RP1, BOSH_VMs", m.pool, m.folder)
	}
	if m.vm.Runtime.PowerState != types.VirtualMachinePowerStatePoweredOn {
		t.Errorf("power state %s", m.vm.Runtime.PowerState)
	}
	if extra(m, "sched.mem.maxmemctl") != "1330" || extra(m, "disk.enableUUID") != "1" {
		t.Errorf("vmx options of the config and the cloud properties: %q %q", extra(m, "sched.mem.maxmemctl"), extra(m, "disk.enableUUID"))
	}
	nics := m.devices.SelectByType((*types.VirtualEthernetCard)(nil))
	if len(nics) != 1 {
		t.Fatalf("%d NICs, want 1", len(nics))
	}
	env := readEnv(t, d, m)
	net := env["networks"].(map[string]any)["default"].(map[string]any)
	if net["mac"] != nics[0].(types.BaseVirtualEthernetCard).GetVirtualEthernetCard().MacAddress || net["ip"] != "10.0.0.20" {
		t.Errorf("env networks %v; the NIC's MAC %s", net, nics[0].(types.BaseVirtualEthernetCard).GetVirtualEthernetCard().MacAddress)
	}
	if env["vm"].(map[string]any)["name"] != vm.CID || env["vm"].(map[string]any)["id"] != m.vm.Self.Value || env["agent_id"] != "a1" {
		t.Errorf("env vm %v agent %v", env["vm"], env["agent_id"])
	}
	disks := env["disks"].(map[string]any)
	if disks["system"] != "0" || disks["ephemeral"].(map[string]any)["id"] == "" {
		t.Errorf("env disks %v: want the system disk by unit 0 and the ephemeral one by UUID (disk.enableUUID)", disks)
	}
	ud, _ := base64.StdEncoding.DecodeString(extra(m, "guestinfo.userdata"))
	if !json.Valid(ud) || extra(m, "guestinfo.userdata.encoding") != "base64" || !bytes.Contains(ud, []byte(vm.CID)) {
		t.Errorf("guestinfo.userdata %q", ud)
	}
	var eph *types.VirtualDisk
	for _, dev := range m.devices.SelectByType((*types.VirtualDisk)(nil)) {
		if strings.HasSuffix(dev.(*types.VirtualDisk).Backing.(*types.VirtualDiskFlatVer2BackingInfo).FileName, "/"+ephemeralFile) {
			eph = dev.(*types.VirtualDisk)
		}
	}
	if eph == nil || eph.CapacityInKB != 1024*1024 {
		t.Fatalf("ephemeral disk %+v, want 1024 MiB", eph)
	}
	if err := d.DeleteVM(bg, vm.CID); err != nil {
		t.Fatal(err)
	}
}
