package vsphere

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vmware/govmomi/find"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/testkit/cpibin"
)

// Two cpi-config entries on one vCenter, as the Director sends them: the
// second names datacenter DC1 (its own clusters and datastores). Each
// VM lands in its context's datacenter, and only that context finds it.
func TestCPIConfigContextsPickTheDatacenter(t *testing.T) {
	sim := newSim(t)
	t.Setenv("RUNWAY_STATE_DIR", t.TempDir())
	cpi := configured(t, officialCPIJSON(sim, nil))
	cpi.Secrets = []string{sim.pass}
	dc1 := map[string]any{"datacenters": []any{map[string]any{"name": "DC1", "datastore_pattern": `\ALocalDS_0\z`,
		"persistent_datastore_pattern": `\ALocalDS_`, "clusters": []any{"DC1_C0"}}}}
	image := stemcellImage(t)
	nets := map[string]any{"default": map[string]any{"type": "manual", "ip": "10.0.3.1", "netmask": "255.255.255.0", "gateway": "10.0.3.254",
		"cloud_properties": map[string]any{"name": "DC1_DVPG0"}}}
	sc := cpibin.String(t, cpi.OK(t, dc1, "create_stemcell", image, map[string]any{}))
	vm := cpibin.VMCID(t, cpi.OK(t, dc1, "create_vm", "a", sc, map[string]any{"cpu": 1, "ram": 512, "disk": 1024}, nets, []string{}, map[string]any{}))
	if r := cpi.OK(t, dc1, "has_vm", vm); string(r) != "true" {
		t.Fatalf("has_vm in its own context: %s", r)
	}
	if r := cpi.OK(t, nil, "has_vm", vm); string(r) != "false" {
		t.Fatalf("has_vm in the file's datacenter (DC0): %s; want false", r)
	}
	d := sim.newDriver(t, nil)
	vc, _ := d.client(bg)
	f := find.NewFinder(vc.c, false)
	dc, err := f.Datacenter(bg, "DC1")
	if err != nil {
		t.Fatal(err)
	}
	f.SetDatacenter(dc)
	if _, err := f.VirtualMachine(bg, "/DC1/vm/BOSH_VMs/"+vm); err != nil {
		t.Fatalf("the VM is not in DC1's vm_folder: %v", err)
	}
	// A context may not configure the host.
	if r := cpi.Call(t, map[string]any{"session_cache": false}, "has_vm", vm); r.Error == nil || !strings.Contains(r.Error.Message, "configures the host") {
		t.Errorf("a context setting session_cache: %+v", r.Error)
	}
	cpi.OK(t, dc1, "delete_vm", vm)
	cpi.OK(t, dc1, "delete_stemcell", sc)
}

// A persistent disk on a datastore only cluster DC0_C1's host mounts is
// moved, on attach, to a datastore the VM's host (DC0_C0) sees — as the
// official CPI moves disks a VM's cluster cannot reach.
func TestAttachMovesADiskTheVMCannotReach(t *testing.T) {
	sim := newSim(t)
	// d places VMs on DC0_C0 only (vcsim gives a clone its source's
	// host, whatever the pool: the stemcell must be on DC0_C0 too); both
	// make disks on either cluster's datastores.
	dcs := func(clusters ...any) map[string]any {
		return map[string]any{"datacenters": []any{map[string]any{
			"name": "DC0", "datastore_pattern": `\ALocalDS_0\z`, "persistent_datastore_pattern": `\A(LocalDS_|C1ONLY)`, "clusters": clusters}}}
	}
	d := sim.newDriver(t, dcs("DC0_C0"))
	both := sim.newDriver(t, dcs("DC0_C0", "DC0_C1"))
	vc, err := d.client(bg)
	if err != nil {
		t.Fatal(err)
	}
	host, err := find.NewFinder(vc.c, false).HostSystem(bg, "/DC0/host/DC0_C1/DC0_C1_H0")
	if err != nil {
		t.Fatal(err)
	}
	dss, err := host.ConfigManager().DatastoreSystem(bg)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "c1only")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := dss.CreateLocalDatastore(bg, "C1ONLY", dir); err != nil {
		t.Fatal(err)
	}
	disk, err := both.CreateDisk(bg, driver.DiskSpec{SizeMiB: 256, CloudProps: driver.PropsOf(map[string]any{"datastores": []string{"C1ONLY"}})})
	if err != nil {
		t.Fatal(err)
	}
	if loc, _ := d.findDisk(bg, vc, disk); loc == nil || loc.ds.name != "C1ONLY" {
		t.Fatalf("disk made on %+v; want C1ONLY", loc)
	}
	sc := testStemcell(t, d)
	vm, err := d.CreateVM(bg, driver.VMSpec{StemcellCID: sc, Networks: manualNet("10.0.4.1", "VM Network"), CloudProps: smallVM(nil)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.AttachDisk(bg, vm.CID, disk); err != nil {
		t.Fatal(err)
	}
	loc, err := d.findDisk(bg, vc, disk)
	if err != nil || !strings.HasPrefix(loc.ds.name, "LocalDS_") {
		t.Fatalf("after attach the disk is on %+v (%v); want a datastore DC0_C0 sees", loc, err)
	}
	if disks, _ := d.GetDisks(bg, vm.CID); len(disks) != 1 || disks[0] != disk {
		t.Fatalf("get_disks %v", disks)
	}
	if err := d.DetachDisk(bg, vm.CID, disk); err != nil {
		t.Fatal(err)
	}
	// resize_disk grows the detached vmdk; shrinking is refused.
	if err := d.ResizeDisk(bg, disk, 512); err != nil {
		t.Fatal(err)
	}
	if size, _ := d.diskBytes(bg, vc, loc); size != 512<<20 {
		t.Errorf("resized disk has %d bytes", size)
	}
	if err := d.ResizeDisk(bg, disk, 128); err == nil || !strings.Contains(err.Error(), "cannot shrink") {
		t.Errorf("shrink: %v", err)
	}
}
