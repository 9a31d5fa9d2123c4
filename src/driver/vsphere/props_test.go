package vsphere

import (
	"errors"
	"strings"
	"testing"

	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/types"

	"github.com/runway-cpi/runway/src/driver"
)

// Every VM cloud property of the official docs (bosh.io/docs/vsphere-cpi,
// "VM Types / VM Extensions"), with a value an operator writes: honoured
// (the VM shows it) or refused by name.
func TestEveryOfficialVMCloudPropertyHasAVerdict(t *testing.T) {
	sim := newSim(t)
	d := sim.newDriver(t, map[string]any{"enable_auto_anti_affinity_drs_rules": true})
	sc := testStemcell(t, d)
	check := func(t *testing.T, m made) {}
	cases := []struct {
		key     string
		value   any
		refusal string
		effect  func(t *testing.T, m made)
	}{
		{"cpu_hot_add_enabled", true, "", func(t *testing.T, m made) { want(t, *m.vm.Config.CpuHotAddEnabled) }},
		{"memory_hot_add_enabled", true, "", func(t *testing.T, m made) { want(t, *m.vm.Config.MemoryHotAddEnabled) }},
		{"nested_hardware_virtualization", true, "", func(t *testing.T, m made) { want(t, *m.vm.Config.NestedHVEnabled) }},
		{"memory_reservation_locked_to_max", true, "", func(t *testing.T, m made) { want(t, *m.vm.Config.MemoryReservationLockedToMax) }},
		{"upgrade_hw_version", true, "", func(t *testing.T, m made) { want(t, m.vm.Config.Version != "vmx-17") }},
		{"vmx_options", map[string]any{"cpuid.coresPerSocket": "2"}, "", func(t *testing.T, m made) { want(t, extra(m, "cpuid.coresPerSocket") == "2") }},
		{"datastores", []any{"LocalDS_1"}, "", func(t *testing.T, m made) {
			want(t, strings.HasPrefix(m.vm.Config.Files.VmPathName, "[LocalDS_1]"))
		}},
		{"datacenters", []any{map[string]any{"name": "DC0", "clusters": []any{map[string]any{"DC0_C0": map[string]any{"resource_pool": "DC0_C0_RP1"}}}}}, "",
			func(t *testing.T, m made) { want(t, m.pool == "DC0_C0_RP1") }},
		{"vm_group", "cpi-vm-group", "", check},
		{"storage_policy", map[string]any{"name": "gold"}, "storage_policy", nil},
		{"nsx", map[string]any{"security_groups": []string{"web"}}, "NSX-V is not supported", nil},
		{"nsxt", map[string]any{"ns_groups": []string{"web"}}, "NSX-T is not supported", nil},
		{"tags", []any{map[string]any{"category": "c", "tag": "t"}}, "tags", nil},
		{"disable_drs", true, "disable_drs", nil},
		{"cpu_reserve_full_mhz", true, "cpu_reserve_full_mhz", nil},
		{"pci_passthroughs", []any{map[string]any{"vendor_id": 4318, "device_id": 7864}}, "pci_passthroughs", nil},
		{"vgpus", []any{"grid_t4-16q"}, "vgpus", nil},
		{"device_groups", []any{"g"}, "device_groups", nil},
		{"root_disk_size_gb", 20, "root_disk_size_gb", nil},
		{"enable_human_readable_name", true, "enable_human_readable_name", nil},
		{"disk_mode", "independent_persistent", `unknown key "disk_mode"`, nil},
	}
	for _, c := range cases {
		t.Run(c.key, func(t *testing.T) {
			vm, err := d.CreateVM(bg, driver.VMSpec{AgentID: "a", StemcellCID: sc, CloudProps: smallVM(map[string]any{c.key: c.value}),
				Networks: manualNet("10.0.1.1", "VM Network"), Env: map[string]any{"bosh": map[string]any{"group": "dir-dep-web"}}})
			if c.refusal != "" {
				if err == nil || !strings.Contains(err.Error(), c.refusal) || !(errors.Is(err, driver.ErrNotSupported) || errors.Is(err, driver.ErrInvalidInput)) {
					t.Fatalf("%v; want a refusal naming %q", err, c.refusal)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = d.DeleteVM(bg, vm.CID) }()
			c.effect(t, inspect(t, d, vm.CID))
		})
	}
	// vm_group and the anti-affinity rule of the instance group.
	vc, _ := d.client(bg)
	cs, _ := d.clusters(bg, vc, d.cfg.dc().Clusters)
	groups, rules := map[string]bool{}, map[string]bool{}
	for _, c := range cs {
		var cl mo.ClusterComputeResource
		if err := vc.pc.RetrieveOne(bg, c.ref, []string{"configurationEx"}, &cl); err != nil {
			t.Fatal(err)
		}
		for _, g := range cl.ConfigurationEx.(*types.ClusterConfigInfoEx).Group {
			groups[g.GetClusterGroupInfo().Name] = true
		}
		for _, r := range cl.ConfigurationEx.(*types.ClusterConfigInfoEx).Rule {
			if _, anti := r.(*types.ClusterAntiAffinityRuleSpec); anti {
				rules[r.GetClusterRuleInfo().Name] = true
			}
		}
	}
	if !groups["cpi-vm-group"] || !rules["dir-dep-web"] {
		t.Errorf("DRS groups %v, anti-affinity rules %v; want cpi-vm-group and dir-dep-web", groups, rules)
	}
}

func want(t *testing.T, ok bool) {
	t.Helper()
	if !ok {
		t.Error("the VM does not show the property")
	}
}

// Disk cloud properties: type (thin, preallocated, eagerZeroedThick) and
// datastores.
func TestDiskCloudProperties(t *testing.T) {
	sim := newSim(t)
	d := sim.newDriver(t, nil)
	vc, _ := d.client(bg)
	for _, c := range []struct {
		props map[string]any
		ds    string
		err   string
	}{
		{map[string]any{"type": "thin", "datastores": []any{"LocalDS_1"}}, "LocalDS_1", ""},
		{map[string]any{"type": "eagerZeroedThick", "datastores": []any{"LocalDS_0"}}, "LocalDS_0", ""},
		{map[string]any{"type": "preallocated"}, "", ""},
		{map[string]any{"type": "sparse"}, "", `cloud_properties.type "sparse"`},
		{map[string]any{"datastores": []any{map[string]any{"clusters": []any{map[string]any{"sp1": map[string]any{}}}}}}, "", "datastore clusters"},
	} {
		cid, err := d.CreateDisk(bg, driver.DiskSpec{SizeMiB: 512, CloudProps: driver.PropsOf(c.props)})
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: %v; want %q", c.props, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%v: %v", c.props, err)
		}
		loc, err := d.findDisk(bg, vc, cid)
		if err != nil || (c.ds != "" && loc.ds.name != c.ds) {
			t.Errorf("%v: disk on %+v, %v; want %s", c.props, loc, err, c.ds)
		}
		if err := d.DeleteDisk(bg, cid); err != nil {
			t.Error(err)
		}
	}
}
