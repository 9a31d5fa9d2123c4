// Package drivertest is the conformance suite every driver must pass. It
// checks the behaviour the CPI service relies on: sentinel errors where the
// Director swallows them, idempotence where callers retry, and cleanup.
package drivertest

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	boshlog "github.com/cloudfoundry/bosh-utils/logger"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/retry"
	"github.com/runway-cpi/runway/src/testkit/testlog"
)

// Fixture tells the suite how to exercise one driver.
type Fixture struct {
	// New returns a fresh driver for one test.
	New func(t *testing.T) driver.Driver
	// StemcellImage returns an image path create_stemcell accepts, and the
	// stemcell cloud properties to pass with it.
	StemcellImage func(t *testing.T) (string, driver.Props)
	// VMProps are cloud properties for a small VM.
	VMProps driver.Props
	// Networks for create_vm (nil: none).
	Networks driver.Networks
	// DiskProps for create_disk.
	DiskProps driver.Props
	// UnknownVM/UnknownDisk are well-formed CIDs that do not exist.
	UnknownVM, UnknownDisk string
}

// Deps are what a cloud driver's tests build it with: its locks in
// lockDir (drivers given one dir share them, as bin/cpi processes do), a
// debug log shown when the test fails, and short waits within a
// two-minute budget.
func Deps(t *testing.T, lockDir string) (driver.Deps, *testlog.Buffer) {
	t.Helper()
	logs := testlog.ShownOnFailure(t, "driver log")
	log := boshlog.NewWriterLogger(boshlog.LevelDebug, logs)
	lk, err := lock.New(lockDir, time.Minute, log)
	if err != nil {
		t.Fatal(err)
	}
	p := retry.Policy{Base: 50 * time.Millisecond, MaxSleep: time.Second, Budget: 2 * time.Minute}
	return driver.Deps{Locker: lk, Logger: log, Retry: p}, logs
}

// Section is a driver's config section: cfg with extra's keys over it.
func Section(cfg, extra map[string]any) json.RawMessage {
	maps.Copy(cfg, extra)
	b, _ := json.Marshal(cfg)
	return b
}

// Run runs the whole suite: the core every driver has, and the optional
// interfaces (listing, power, resizing, disk metadata, snapshots) for the
// drivers that implement them.
func Run(t *testing.T, f Fixture) {
	s := &suite{ctx: context.Background(), f: f, d: f.New(t),
		tags: map[string]string{"created_by": "drivertest", "director": "dt-director", "agent_id": "dt-agent"}}
	s.lister, s.listing = s.d.(driver.VMLister)
	s.power, s.powered = s.d.(driver.PowerSwitch)
	s.resizer, s.resizing = s.d.(driver.DiskResizer)
	s.labeler, s.labeling = s.d.(driver.DiskMetadata)
	s.snapper, s.snapping = s.d.(driver.Snapshotter)
	t.Run("stemcell formats", s.stemcellFormats)
	s.createStemcell(t)
	t.Run("vm lifecycle", s.vmLifecycle)
	t.Run("unknown vm", s.unknownVM)
	t.Run("unknown cloud property", s.unknownCloudProperty)
	t.Run("unknown stemcell", s.unknownStemcell)
	t.Run("disk lifecycle", s.diskLifecycle)
	t.Run("delete vm detaches its disks", s.deleteVMDetachesDisks)
	t.Run("unknown disk", s.unknownDisk)
	t.Run("path-like cids are refused", s.pathLikeCIDs)
}

// suite is one driver under test, its optional interfaces, and the
// stemcell every VM of the suite is made from.
type suite struct {
	ctx  context.Context
	f    Fixture
	d    driver.Driver
	sc   string
	tags map[string]string

	lister   driver.VMLister
	listing  bool
	power    driver.PowerSwitch
	powered  bool
	resizer  driver.DiskResizer
	resizing bool
	labeler  driver.DiskMetadata
	labeling bool
	snapper  driver.Snapshotter
	snapping bool
}

// createStemcell makes the suite's stemcell; deleting it (twice: the
// second must not fail) is the last cleanup.
func (s *suite) createStemcell(t *testing.T) {
	ctx, d := s.ctx, s.d
	img, scProps := s.f.StemcellImage(t)
	sc, err := d.CreateStemcell(ctx, driver.StemcellSpec{ImagePath: img, CloudProps: scProps, Tags: map[string]string{"created_by": "drivertest"}})
	if err != nil {
		t.Fatalf("create_stemcell: %v", err)
	}
	s.sc = sc
	t.Cleanup(func() {
		if err := d.DeleteStemcell(ctx, sc); err != nil {
			t.Errorf("delete_stemcell: %v", err)
		}
		if err := d.DeleteStemcell(ctx, sc); err != nil {
			t.Errorf("delete_stemcell of a deleted stemcell must not fail: %v", err)
		}
	})
}

func (s *suite) createVM(t *testing.T, name string) driver.VM {
	t.Helper()
	vm, err := s.d.CreateVM(s.ctx, driver.VMSpec{Name: name, AgentID: "dt-agent", StemcellCID: s.sc, CloudProps: s.f.VMProps,
		Networks: s.f.Networks, Tags: s.tags, AgentSettings: []byte(`{"agent_id":"dt-agent"}`)})
	if err != nil {
		t.Fatalf("create_vm: %v", err)
	}
	if vm.CID == "" {
		t.Fatal("create_vm returned an empty cid")
	}
	return vm
}

func (s *suite) stemcellFormats(t *testing.T) {
	d := s.d
	if len(d.StemcellFormats()) == 0 {
		t.Fatal("driver reports no stemcell formats")
	}
}

func (s *suite) vmLifecycle(t *testing.T) {
	ctx, d, f, lister, listing, power, powered := s.ctx, s.d, s.f, s.lister, s.listing, s.power, s.powered
	vm := s.createVM(t, "")
	if ok, err := d.HasVM(ctx, vm.CID); err != nil || !ok {
		t.Fatalf("has_vm after create = %v, %v; want true", ok, err)
	}
	for name := range f.Networks {
		if vm.Networks[name].IP == "" {
			t.Errorf("network %s has no address in create_vm's answer: %+v", name, vm.Networks)
		}
	}
	if err := d.SetVMMetadata(ctx, vm.CID, map[string]string{"deployment": "dt", "name": "dt/0", "index": "0"}); err != nil {
		t.Fatalf("set_vm_metadata: %v", err)
	}
	if listing {
		list, err := lister.ListVMs(ctx, map[string]string{"agent_id": "dt-agent", "director": "dt-director"})
		if err != nil {
			t.Fatalf("list vms: %v", err)
		}
		i := slices.IndexFunc(list, func(v driver.VMInfo) bool { return v.CID == vm.CID })
		if i < 0 {
			t.Fatalf("list by tag does not find %s: %+v", vm.CID, list)
		}
		// garm and reapers read addresses from the listing.
		for name, n := range vm.Networks {
			if got := list[i].Networks[name].IP; got != n.IP {
				t.Errorf("list_vms: network %s has address %q, create_vm answered %q", name, got, n.IP)
			}
		}
		if other, _ := lister.ListVMs(ctx, map[string]string{"director": "someone-else"}); slices.ContainsFunc(other, func(v driver.VMInfo) bool { return v.CID == vm.CID }) {
			t.Fatalf("list with a foreign tag finds %s", vm.CID)
		}
	}
	if powered {
		if err := power.StopVM(ctx, vm.CID); err != nil {
			t.Fatalf("stop vm: %v", err)
		}
		if listing {
			if list, _ := lister.ListVMs(ctx, map[string]string{"agent_id": "dt-agent"}); !slices.ContainsFunc(list, func(v driver.VMInfo) bool { return v.CID == vm.CID && v.State == "stopped" }) {
				t.Fatalf("stopped vm not listed as stopped: %+v", list)
			}
		}
		if err := power.StartVM(ctx, vm.CID); err != nil {
			t.Fatalf("start vm: %v", err)
		}
	}
	if err := d.RebootVM(ctx, vm.CID); err != nil {
		t.Fatalf("reboot_vm: %v", err)
	}
	if ok, _ := d.HasVM(ctx, vm.CID); !ok {
		t.Fatal("vm gone after reboot")
	}
	if err := d.DeleteVM(ctx, vm.CID); err != nil {
		t.Fatalf("delete_vm: %v", err)
	}
	if ok, err := d.HasVM(ctx, vm.CID); err != nil || ok {
		t.Fatalf("has_vm after delete = %v, %v; want false", ok, err)
	}
	if err := d.DeleteVM(ctx, vm.CID); !errors.Is(err, driver.ErrVMNotFound) {
		t.Fatalf("delete_vm twice: %v; want ErrVMNotFound", err)
	}
}

func (s *suite) unknownVM(t *testing.T) {
	ctx, d, f, power, powered := s.ctx, s.d, s.f, s.power, s.powered
	calls := map[string]func() error{
		"delete_vm":       func() error { return d.DeleteVM(ctx, f.UnknownVM) },
		"reboot_vm":       func() error { return d.RebootVM(ctx, f.UnknownVM) },
		"set_vm_metadata": func() error { return d.SetVMMetadata(ctx, f.UnknownVM, map[string]string{"a": "b"}) },
		"get_disks":       func() error { _, err := d.GetDisks(ctx, f.UnknownVM); return err },
	}
	if powered {
		calls["stop_vm"] = func() error { return power.StopVM(ctx, f.UnknownVM) }
		calls["start_vm"] = func() error { return power.StartVM(ctx, f.UnknownVM) }
	}
	s.allNotFound(t, "vm", driver.ErrVMNotFound, calls, d.HasVM, f.UnknownVM)
}

// allNotFound: every call on an unknown resource of kind fails with
// notFound, and has (has_vm, has_disk) answers false with no error.
func (s *suite) allNotFound(t *testing.T, kind string, notFound error, calls map[string]func() error,
	has func(ctx context.Context, cid string) (bool, error), cid string) {
	t.Helper()
	for name, call := range calls {
		if err := call(); !errors.Is(err, notFound) {
			t.Errorf("%s on unknown %s: %v; want %v", name, kind, err, notFound)
		}
	}
	if ok, err := has(s.ctx, cid); err != nil || ok {
		t.Errorf("has_%s on unknown %s = %v, %v; want false, nil", kind, kind, ok, err)
	}
}

// Nothing is silently ignored: a cloud property no driver knows is an
// input error naming it.
func (s *suite) unknownCloudProperty(t *testing.T) {
	ctx, d, f, sc, tags := s.ctx, s.d, s.f, s.sc, s.tags
	bad := map[string]any{"no_such_key": true}
	_, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "dt-agent", StemcellCID: sc, CloudProps: merge(f.VMProps, bad), Networks: f.Networks, Tags: tags})
	if !errors.Is(err, driver.ErrInvalidInput) || !strings.Contains(err.Error(), "no_such_key") {
		t.Errorf("create_vm with an unknown cloud property: %v; want ErrInvalidInput naming it", err)
	}
	_, err = d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 1024, CloudProps: merge(f.DiskProps, bad), Tags: tags})
	if !errors.Is(err, driver.ErrInvalidInput) || !strings.Contains(err.Error(), "no_such_key") {
		t.Errorf("create_disk with an unknown cloud property: %v; want ErrInvalidInput naming it", err)
	}
}

func (s *suite) unknownStemcell(t *testing.T) {
	ctx, d, f, tags := s.ctx, s.d, s.f, s.tags
	_, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "dt-agent", StemcellCID: "sc-does-not-exist", CloudProps: f.VMProps, Networks: f.Networks, Tags: tags})
	if err == nil {
		t.Fatal("create_vm with an unknown stemcell succeeded")
	}
}

func (s *suite) diskLifecycle(t *testing.T) {
	ctx, d, f, tags, resizer, resizing, labeler, labeling, snapper, snapping := s.ctx, s.d, s.f, s.tags, s.resizer, s.resizing, s.labeler, s.labeling, s.snapper, s.snapping
	vm := s.createVM(t, "")
	t.Cleanup(func() { _ = d.DeleteVM(ctx, vm.CID) })
	disk, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 1024, CloudProps: f.DiskProps, VMCID: vm.CID, Tags: tags})
	if err != nil {
		t.Fatalf("create_disk: %v", err)
	}
	if ok, err := d.HasDisk(ctx, disk); err != nil || !ok {
		t.Fatalf("has_disk = %v, %v", ok, err)
	}
	if labeling {
		if err := labeler.SetDiskMetadata(ctx, disk, map[string]string{"deployment": "dt"}); err != nil {
			t.Fatalf("set_disk_metadata: %v", err)
		}
	}
	if err := d.DetachDisk(ctx, vm.CID, disk); !errors.Is(err, driver.ErrDiskNotAttached) {
		t.Fatalf("detach of an unattached disk: %v; want ErrDiskNotAttached", err)
	}
	hint, err := d.AttachDisk(ctx, vm.CID, disk)
	if err != nil {
		t.Fatalf("attach_disk: %v", err)
	}
	if hint == nil || hint == "" {
		t.Fatal("attach_disk returned an empty hint")
	}
	disks, err := d.GetDisks(ctx, vm.CID)
	if err != nil || !slices.Equal(disks, []string{disk}) {
		t.Fatalf("get_disks = %v, %v; want [%s]", disks, err, disk)
	}
	if snapping {
		snap, err := snapper.SnapshotDisk(ctx, disk, map[string]string{"deployment": "dt"})
		if err != nil {
			t.Fatalf("snapshot_disk: %v", err)
		}
		if err := snapper.DeleteSnapshot(ctx, snap); err != nil {
			t.Fatalf("delete_snapshot: %v", err)
		}
	}
	if err := d.DetachDisk(ctx, vm.CID, disk); err != nil {
		t.Fatalf("detach_disk: %v", err)
	}
	if disks, _ := d.GetDisks(ctx, vm.CID); len(disks) != 0 {
		t.Fatalf("get_disks after detach = %v", disks)
	}
	if resizing {
		if err := resizer.ResizeDisk(ctx, disk, 2048); err != nil {
			t.Fatalf("resize_disk grow: %v", err)
		}
		if err := resizer.ResizeDisk(ctx, disk, 1024); !errors.Is(err, driver.ErrNotSupported) {
			t.Fatalf("resize_disk shrink: %v; want ErrNotSupported", err)
		}
	}
	if err := d.DeleteDisk(ctx, disk); err != nil {
		t.Fatalf("delete_disk: %v", err)
	}
	if ok, _ := d.HasDisk(ctx, disk); ok {
		t.Fatal("has_disk after delete = true")
	}
	if err := d.DeleteDisk(ctx, disk); !errors.Is(err, driver.ErrDiskNotFound) {
		t.Fatalf("delete_disk twice: %v; want ErrDiskNotFound", err)
	}
}

func (s *suite) deleteVMDetachesDisks(t *testing.T) {
	ctx, d, f, tags := s.ctx, s.d, s.f, s.tags
	vm := s.createVM(t, "")
	disk, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 1024, CloudProps: f.DiskProps, Tags: tags})
	if err != nil {
		t.Fatalf("create_disk: %v", err)
	}
	t.Cleanup(func() { _ = d.DeleteDisk(ctx, disk) })
	if _, err := d.AttachDisk(ctx, vm.CID, disk); err != nil {
		t.Fatalf("attach_disk: %v", err)
	}
	if err := d.DeleteVM(ctx, vm.CID); err != nil {
		t.Fatalf("delete_vm: %v", err)
	}
	if ok, _ := d.HasDisk(ctx, disk); !ok {
		t.Fatal("persistent disk lost with its vm")
	}
	if err := d.DeleteDisk(ctx, disk); err != nil {
		t.Fatalf("delete_disk of a disk whose vm was deleted: %v", err)
	}
}

func (s *suite) unknownDisk(t *testing.T) {
	ctx, d, f, resizer, resizing, labeler, labeling, snapper, snapping := s.ctx, s.d, s.f, s.resizer, s.resizing, s.labeler, s.labeling, s.snapper, s.snapping
	vm := s.createVM(t, "")
	t.Cleanup(func() { _ = d.DeleteVM(ctx, vm.CID) })
	calls := map[string]func() error{
		"delete_disk": func() error { return d.DeleteDisk(ctx, f.UnknownDisk) },
		"attach_disk": func() error { _, err := d.AttachDisk(ctx, vm.CID, f.UnknownDisk); return err },
		"detach_disk": func() error { return d.DetachDisk(ctx, vm.CID, f.UnknownDisk) },
	}
	if resizing {
		calls["resize_disk"] = func() error { return resizer.ResizeDisk(ctx, f.UnknownDisk, 4096) }
	}
	if labeling {
		calls["set_disk_metadata"] = func() error { return labeler.SetDiskMetadata(ctx, f.UnknownDisk, map[string]string{"a": "b"}) }
	}
	if snapping {
		calls["snapshot_disk"] = func() error { _, err := snapper.SnapshotDisk(ctx, f.UnknownDisk, nil); return err }
	}
	s.allNotFound(t, "disk", driver.ErrDiskNotFound, calls, d.HasDisk, f.UnknownDisk)
}

func (s *suite) pathLikeCIDs(t *testing.T) {
	ctx, d := s.ctx, s.d
	for _, cid := range []string{"", "..", "../x", "a/b", "/etc/passwd"} {
		if _, err := d.HasVM(ctx, cid); !errors.Is(err, driver.ErrInvalidInput) {
			t.Errorf("has_vm(%q): %v; want ErrInvalidInput", cid, err)
		}
		if err := d.DeleteDisk(ctx, cid); !errors.Is(err, driver.ErrInvalidInput) {
			t.Errorf("delete_disk(%q): %v; want ErrInvalidInput", cid, err)
		}
	}
}

// merge is p with extra keys added.
func merge(p driver.Props, extra map[string]any) driver.Props {
	m := map[string]any{}
	_ = json.Unmarshal(p.Raw(), &m)
	for k, v := range extra {
		m[k] = v
	}
	return driver.PropsOf(m)
}
