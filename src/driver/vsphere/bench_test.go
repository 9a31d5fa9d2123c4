package vsphere

import (
	"testing"

	"github.com/runway-cpi/runway/src/driver"
)

// BenchmarkMethods times each method on vcsim in process and reports the
// HTTP requests it sends to vCenter (requests/op). Each op is one call of
// a driver that has already connected, as within one bin/cpi process
// after its first call; "connect" is what a process's first call adds
// with a cached session (the session_cache default) — numbers in
// docs/benchmarks.md.
func BenchmarkMethods(b *testing.B) {
	sim := newSim(b)
	d := sim.newDriver(b, map[string]any{"datacenters": []any{map[string]any{"name": "DC0", "datastore_pattern": `\ALocalDS_0\z`,
		"persistent_datastore_pattern": `\ALocalDS_0\z`, "clusters": []any{"DC0_C0"}}}})
	sc, err := d.CreateStemcell(bg, driverSpec(b))
	if err != nil {
		b.Fatal(err)
	}
	spec := func(i int) driver.VMSpec {
		return driver.VMSpec{StemcellCID: sc, CloudProps: smallVM(nil), Tags: map[string]string{"director": "bench", "agent_id": "a"},
			Networks: driver.Networks{"default": {Type: "dynamic", CloudProperties: driver.PropsOf(map[string]any{"name": "VM Network"})}}}
	}
	vm, err := d.CreateVM(bg, spec(0))
	if err != nil {
		b.Fatal(err)
	}
	run := func(name string, op func(i int)) {
		b.Run(name, func(b *testing.B) {
			before := d.Requests()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				op(i)
			}
			b.StopTimer()
			b.ReportMetric(float64(d.Requests()-before)/float64(b.N), "requests/op")
		})
	}
	check := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}
	run("connect", func(int) {
		fresh, err := New(sim.section(nil), driver.Deps{StateDir: d.stateDir, Locker: d.Locks, Retry: d.Retry})
		check(err)
		_, err = fresh.client(bg)
		check(err)
		d.requests.Add(fresh.Requests())
	})
	run("create_vm+delete_vm", func(i int) {
		v, err := d.CreateVM(bg, spec(i))
		check(err)
		check(d.DeleteVM(bg, v.CID))
	})
	run("has_vm", func(int) { _, err := d.HasVM(bg, vm.CID); check(err) })
	run("has_vm(absent)", func(int) { _, err := d.HasVM(bg, "vm-00000000-0000-4000-8000-000000000000"); check(err) })
	run("set_vm_metadata", func(int) {
		check(d.SetVMMetadata(bg, vm.CID, map[string]string{"deployment": "d", "job": "j", "index": "0"}))
	})
	run("reboot_vm", func(int) { check(d.RebootVM(bg, vm.CID)) })
	run("create_disk+delete_disk", func(int) {
		disk, err := d.CreateDisk(bg, driver.DiskSpec{SizeMiB: 256, VMCID: vm.CID})
		check(err)
		check(d.DeleteDisk(bg, disk))
	})
	disk, err := d.CreateDisk(bg, driver.DiskSpec{SizeMiB: 256})
	check(err)
	run("attach_disk+detach_disk", func(int) {
		_, err := d.AttachDisk(bg, vm.CID, disk)
		check(err)
		check(d.DetachDisk(bg, vm.CID, disk))
	})
	run("has_disk", func(int) { _, err := d.HasDisk(bg, disk); check(err) })
	run("get_disks", func(int) { _, err := d.GetDisks(bg, vm.CID); check(err) })
	run("list_vms", func(int) { _, err := d.ListVMs(bg, map[string]string{"director": "bench"}); check(err) })
	run("create_stemcell+delete_stemcell", func(int) {
		s, err := d.CreateStemcell(bg, driverSpec(b))
		check(err)
		check(d.DeleteStemcell(bg, s))
	})
}
