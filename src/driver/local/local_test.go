package local_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/drivertest"
	"github.com/runway-cpi/runway/src/driver/local"
	"github.com/runway-cpi/runway/src/lock"
)

func newDriver(t *testing.T, root string) *local.Driver {
	t.Helper()
	lk, err := lock.New(filepath.Join(root, "locks"), 10*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	d, err := local.New([]byte(`{"stop_grace_seconds": 2}`), root, lk, nil)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// writeImage builds a gzipped tarball with the given entries.
func writeImage(t *testing.T, entries map[string]string) string {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, body := range entries {
		h := &tar.Header{Name: name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}
		if strings.HasPrefix(body, "->") {
			h = &tar.Header{Name: name, Linkname: body[2:], Typeflag: tar.TypeSymlink}
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(body))
		}
	}
	tw.Close()
	gz.Close()
	p := filepath.Join(t.TempDir(), "image.tgz")
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConformance(t *testing.T) {
	drivertest.Run(t, drivertest.Fixture{
		New: func(t *testing.T) driver.Driver { return newDriver(t, t.TempDir()) },
		StemcellImage: func(t *testing.T) (string, driver.Props) {
			return writeImage(t, map[string]string{"root.img": "disk image"}), driver.Props{}
		},
		VMProps:     driver.PropsOf(map[string]any{"command": "exec sleep 300"}),
		Networks:    driver.Networks{"runners": {Type: "dynamic"}},
		UnknownVM:   "vm-00000000-0000-0000-0000-000000000000",
		UnknownDisk: "disk-00000000-0000-0000-0000-000000000000",
	})
}

func stemcell(t *testing.T, d *local.Driver) string {
	t.Helper()
	sc, err := d.CreateStemcell(context.Background(), driver.StemcellSpec{ImagePath: writeImage(t, map[string]string{"root.img": "x"})})
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// newDriverAndStemcell is a driver on a state dir of its own (root) and a
// stemcell made by it.
func newDriverAndStemcell(t *testing.T) (root string, d *local.Driver, sc string) {
	t.Helper()
	root = t.TempDir()
	d = newDriver(t, root)
	return root, d, stemcell(t, d)
}

// waitFile waits for a file the VM process writes; the process runs
// asynchronously, so this is an event wait, bounded, not a fixed sleep.
func waitFile(t *testing.T, path string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
			return string(b)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%s never appeared", path)
	return ""
}

func TestVMProcessIsDetachedSupervisedAndStopped(t *testing.T) {
	ctx := context.Background()
	root, d, sc := newDriverAndStemcell(t)
	// The process records its pid, environment and a marker file, then
	// ignores SIGTERM so delete has to escalate to SIGKILL.
	script := `#!/bin/sh
trap '' TERM
echo $$ > "$RUNWAY_VM_DIR/proc.pid"
env > "$RUNWAY_VM_DIR/proc.env"
echo "hello from $RUNWAY_AGENT_ID"
sleep 300 & wait
`
	vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "agent-7", StemcellCID: sc,
		Env: map[string]any{"user_data": script}, AgentSettings: []byte(`{"agent_id":"agent-7"}`),
		CloudProps: driver.PropsOf(map[string]any{"env": map[string]any{"EXTRA": "yes"}})})
	if err != nil {
		t.Fatal(err)
	}
	vmDir := filepath.Join(root, "vms", vm.CID)
	pid := strings.TrimSpace(waitFile(t, filepath.Join(vmDir, "proc.pid")))
	env := waitFile(t, filepath.Join(vmDir, "proc.env"))
	for _, want := range []string{"RUNWAY_AGENT_ID=agent-7", "RUNWAY_VM_CID=" + vm.CID, "EXTRA=yes", "RUNWAY_AGENT_SETTINGS=" + filepath.Join(vmDir, "agent-settings.json")} {
		if !strings.Contains(env, want) {
			t.Errorf("vm process environment lacks %s:\n%s", want, env)
		}
	}
	if os.Getenv("HOME") != "" && strings.Contains(env, "HOME="+os.Getenv("HOME")+"\n") {
		t.Error("vm process inherited the caller's HOME")
	}
	if got := waitFile(t, filepath.Join(vmDir, "console.log")); !strings.Contains(got, "hello from agent-7") {
		t.Errorf("console log = %q", got)
	}
	if b, _ := os.ReadFile(filepath.Join(vmDir, "agent-settings.json")); string(b) != `{"agent_id":"agent-7"}` {
		t.Errorf("agent settings = %s", b)
	}
	if _, err := os.Stat("/proc/" + pid); err != nil {
		t.Fatalf("vm process %s not running: %v", pid, err)
	}
	if err := d.DeleteVM(ctx, vm.CID); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile("/proc/" + pid + "/stat"); err == nil && !strings.Contains(string(b), ") Z") {
		t.Fatalf("vm process %s survived delete_vm: %s", pid, b)
	}
	if _, err := os.Stat(vmDir); !os.IsNotExist(err) {
		t.Fatalf("vm dir still there: %v", err)
	}
}

func TestRebootRestartsTheProcess(t *testing.T) {
	ctx := context.Background()
	root, d, sc := newDriverAndStemcell(t)
	vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "a", StemcellCID: sc,
		CloudProps: driver.PropsOf(map[string]any{"command": []any{"/bin/sh", "-c", `echo boot >> "$RUNWAY_VM_DIR/boots"; exec sleep 300`}})})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteVM(ctx, vm.CID)
	boots := filepath.Join(root, "vms", vm.CID, "boots")
	waitFile(t, boots)
	if err := d.RebootVM(ctx, vm.CID); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(boots)
		if strings.Count(string(b), "boot") == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("process not restarted: boots=%q", b)
		}
		time.Sleep(5 * time.Millisecond)
	}
	list, _ := d.ListVMs(ctx, nil)
	if len(list) != 1 || list[0].State != "running" {
		t.Fatalf("list = %+v; want one running vm", list)
	}
	if err := d.StopVM(ctx, vm.CID); err != nil {
		t.Fatal(err)
	}
	if list, _ := d.ListVMs(ctx, nil); list[0].State != "stopped" {
		t.Fatalf("state after stop = %s", list[0].State)
	}
}

func TestCommandThatCannotStartLeavesNothing(t *testing.T) {
	ctx := context.Background()
	root, d, sc := newDriverAndStemcell(t)
	_, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "a", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"command": 42})})
	if !errors.Is(err, driver.ErrInvalidInput) {
		t.Fatalf("bad command type: %v; want ErrInvalidInput", err)
	}
	entries, _ := os.ReadDir(filepath.Join(root, "vms"))
	if len(entries) != 0 {
		t.Fatalf("vms dir not empty: %v", entries)
	}
}

func TestStemcellArchiveThatEscapesIsRefused(t *testing.T) {
	d := newDriver(t, t.TempDir())
	for name, entries := range map[string]map[string]string{
		"dotdot":        {"../evil": "x"},
		"through-link":  {"link": "->/tmp", "link/evil": "x"},
		"absolute-link": {"a/b/../../../x": "y"},
	} {
		_, err := d.CreateStemcell(context.Background(), driver.StemcellSpec{ImagePath: writeImage(t, entries)})
		if err == nil {
			t.Errorf("%s: archive accepted", name)
		}
	}
	notTar := filepath.Join(t.TempDir(), "image")
	os.WriteFile(notTar, []byte("plain text, not a tarball"), 0o600)
	if _, err := d.CreateStemcell(context.Background(), driver.StemcellSpec{ImagePath: notTar}); err == nil || !strings.Contains(err.Error(), "tar") {
		t.Errorf("non-tar image: %v", err)
	}
}

func TestAddressesAreUniqueAndReleased(t *testing.T) {
	ctx := context.Background()
	_, d, sc := newDriverAndStemcell(t)
	nets := driver.Networks{"a": {Type: "dynamic"}, "b": {Type: "manual", IP: "10.0.0.5"}}
	seen := map[string]bool{}
	var cids []string
	for i := 0; i < 5; i++ {
		vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "a", StemcellCID: sc, Networks: nets})
		if err != nil {
			t.Fatal(err)
		}
		if vm.Networks["b"].IP != "10.0.0.5" {
			t.Errorf("manual ip not kept: %+v", vm.Networks["b"])
		}
		ip := vm.Networks["a"].IP
		if seen[ip] || !strings.HasPrefix(ip, "127.101.") {
			t.Fatalf("address %q reused or outside the range", ip)
		}
		seen[ip] = true
		cids = append(cids, vm.CID)
	}
	if err := d.DeleteVM(ctx, cids[0]); err != nil {
		t.Fatal(err)
	}
	vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "a", StemcellCID: sc, Networks: nets})
	if err != nil {
		t.Fatal(err)
	}
	if vm.Networks["a"].IP != "127.101.0.2" {
		t.Fatalf("released address not reused: got %s", vm.Networks["a"].IP)
	}
}

// Two driver instances share nothing in memory, like two bin/cpi
// processes: attachments made through both stay consistent.
func TestConcurrentAttachThroughSeparateInstances(t *testing.T) {
	ctx := context.Background()
	root := t.TempDir()
	d1, d2 := newDriver(t, root), newDriver(t, root)
	sc := stemcell(t, d1)
	vm, err := d1.CreateVM(ctx, driver.VMSpec{AgentID: "a", StemcellCID: sc})
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	disks := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			d := d1
			if i%2 == 1 {
				d = d2
			}
			cid, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 1})
			if err == nil {
				_, err = d.AttachDisk(ctx, vm.CID, cid)
			}
			disks[i] = cid
			errs <- err
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got, err := d2.GetDisks(ctx, vm.CID)
	if err != nil || len(got) != n {
		t.Fatalf("get_disks = %d disks, %v; want %d", len(got), err, n)
	}
}

func TestBadConfig(t *testing.T) {
	lk, _ := lock.New(t.TempDir(), time.Second, nil)
	for _, section := range []string{`{"stop_grace_secs": 1}`, `{"loopback_cidr": "10.0.0.0/8"}`, `{"shell": "sh"}`, `{"stop_grace_seconds": "5"}`} {
		if _, err := local.New([]byte(section), t.TempDir(), lk, nil); err == nil {
			t.Errorf("config %s accepted", section)
		}
	}
}

// Lock files belong to resources: once a resource is gone (or a call named
// one that never existed), its lock file is gone too.
func TestLockFilesDoNotPileUp(t *testing.T) {
	root := t.TempDir()
	d := newDriver(t, root)
	ctx := context.Background()
	sc, err := d.CreateStemcell(ctx, driver.StemcellSpec{ImagePath: writeImage(t, map[string]string{"root.img": "x"})})
	if err != nil {
		t.Fatal(err)
	}
	vm, err := d.CreateVM(ctx, driver.VMSpec{Name: "vm-locks", AgentID: "a", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"command": "exec sleep 300"})})
	if err != nil {
		t.Fatal(err)
	}
	disk, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.AttachDisk(ctx, vm.CID, disk); err != nil {
		t.Fatal(err)
	}
	snap, err := d.SnapshotDisk(ctx, disk, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, step := range []error{
		d.SetVMMetadata(ctx, vm.CID, map[string]string{"name": "x"}),
		d.DeleteSnapshot(ctx, snap),
		d.DetachDisk(ctx, vm.CID, disk),
		d.DeleteDisk(ctx, disk),
		d.DeleteVM(ctx, vm.CID),
		d.DeleteStemcell(ctx, sc),
	} {
		if step != nil {
			t.Fatal(step)
		}
	}
	// Calls naming resources that never existed.
	_ = d.DeleteVM(ctx, "vm-never")
	_ = d.DeleteDisk(ctx, "disk-never")
	_, _ = d.AttachDisk(ctx, "vm-never", "disk-never")
	_ = d.SetDiskMetadata(ctx, "disk-never", nil)
	left, _ := filepath.Glob(filepath.Join(root, "locks", "*-*.lock"))
	var perResource []string
	for _, l := range left {
		if !strings.HasPrefix(filepath.Base(l), "state-") {
			perResource = append(perResource, filepath.Base(l))
		}
	}
	if len(perResource) != 0 {
		t.Fatalf("lock files of gone resources left: %v", perResource)
	}
}

// tmpfsRoot mounts a small tmpfs as a state dir: a disk that really fills.
func tmpfsRoot(t *testing.T, mib int) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm", mib), "tmpfs", dir).CombinedOutput(); err != nil {
		t.Fatalf("mounting a tmpfs (the test needs root): %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("umount", "-l", dir).Run() })
	return dir
}

// gzipBomb is a small .tgz whose one file unpacks to size bytes of zeros.
func gzipBomb(t *testing.T, size int64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "bomb.tgz")
	f, _ := os.Create(p)
	gz, _ := gzip.NewWriterLevel(f, gzip.BestCompression)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: "root.img", Mode: 0o644, Size: size, Typeflag: tar.TypeReg})
	io.CopyN(tw, zeros{}, size)
	tw.Close()
	gz.Close()
	f.Close()
	return p
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// Unpacking and copying stop before the state dir's disk fills (a typed
// NoDiskSpace, nothing left behind), and an image may not unpack past
// max_image_mib.
func TestUnpackAndSnapshotRespectFreeSpaceAndCaps(t *testing.T) {
	ctx := context.Background()
	root := tmpfsRoot(t, 96) // 64 MiB are kept free: ~32 MiB of room
	d := newDriver(t, root)
	bomb := gzipBomb(t, 300<<20)
	if st, _ := os.Stat(bomb); st.Size() > 1<<20 {
		t.Fatalf("the bomb is %d bytes", st.Size())
	}
	_, err := d.CreateStemcell(ctx, driver.StemcellSpec{ImagePath: bomb})
	if !errors.Is(err, driver.ErrNoDiskSpace) {
		t.Fatalf("300 MiB image on a 96 MiB disk: %v; want ErrNoDiskSpace", err)
	}
	if left, _ := os.ReadDir(filepath.Join(root, "stemcells")); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}

	lk, _ := lock.New(filepath.Join(root, "locks"), 10*time.Second, nil)
	capped, err := local.New([]byte(`{"max_image_mib": 4}`), root, lk, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := capped.CreateStemcell(ctx, driver.StemcellSpec{ImagePath: gzipBomb(t, 8<<20)}); !errors.Is(err, driver.ErrInvalidInput) ||
		!strings.Contains(err.Error(), "max_image_mib") {
		t.Fatalf("8 MiB image with max_image_mib 4: %v", err)
	}

	disk, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 20})
	if err != nil {
		t.Fatal(err)
	}
	data := bytes.Repeat([]byte{1}, 20<<20)
	if err := os.WriteFile(filepath.Join(root, "disks", disk, "data", "blob"), data, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.SnapshotDisk(ctx, disk, nil); !errors.Is(err, driver.ErrNoDiskSpace) {
		t.Fatalf("20 MiB snapshot with ~12 MiB of room: %v; want ErrNoDiskSpace", err)
	}
	if left, _ := os.ReadDir(filepath.Join(root, "snapshots")); len(left) != 0 {
		t.Fatalf("left behind: %v", left)
	}
}

// A FIFO (or a device) as image_path would block the read forever.
func TestStemcellImageMustBeARegularFile(t *testing.T) {
	d := newDriver(t, t.TempDir())
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := d.CreateStemcell(context.Background(), driver.StemcellSpec{ImagePath: fifo})
	if !errors.Is(err, driver.ErrInvalidInput) || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("fifo: %v", err)
	}
}

// An attach killed between recording the attachment and making the link,
// or a VM that went without clearing the record, never leaves a disk that
// nobody can detach or delete.
func TestAttachmentsOfGoneVMsCanBeCleared(t *testing.T) {
	root, d, sc := newDriverAndStemcell(t)
	ctx := context.Background()
	mkVM := func() string {
		vm, err := d.CreateVM(ctx, driver.VMSpec{StemcellCID: sc, AgentID: "a"})
		if err != nil {
			t.Fatal(err)
		}
		return vm.CID
	}
	mkDisk := func(vm string) string {
		disk, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 1})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.AttachDisk(ctx, vm, disk); err != nil {
			t.Fatal(err)
		}
		return disk
	}
	// 1. The link gone (killed before it was made): get_disks still
	// lists the disk, delete_vm clears it, delete_disk deletes it.
	vm := mkVM()
	disk := mkDisk(vm)
	if err := os.Remove(filepath.Join(root, "vms", vm, "disks", disk)); err != nil {
		t.Fatal(err)
	}
	if got, err := d.GetDisks(ctx, vm); err != nil || len(got) != 1 || got[0] != disk {
		t.Errorf("get_disks = %v, %v; want the recorded disk", got, err)
	}
	if err := d.DeleteVM(ctx, vm); err != nil {
		t.Fatal(err)
	}
	if err := d.DeleteDisk(ctx, disk); err != nil {
		t.Errorf("delete_disk after delete_vm: %v", err)
	}
	// 2. The VM gone with the record still naming it: detach_disk
	// forgets the attachment, and delete_disk works without it too.
	for _, detachFirst := range []bool{true, false} {
		vm := mkVM()
		disk := mkDisk(vm)
		if err := os.RemoveAll(filepath.Join(root, "vms", vm)); err != nil {
			t.Fatal(err)
		}
		if detachFirst {
			if err := d.DetachDisk(ctx, vm, disk); err != nil {
				t.Errorf("detach_disk from a gone vm: %v", err)
			}
		}
		if err := d.DeleteDisk(ctx, disk); err != nil {
			t.Errorf("delete_disk of a disk attached to a gone vm: %v", err)
		}
	}
	// A live VM's attachment still stops a delete.
	vm = mkVM()
	disk = mkDisk(vm)
	if err := d.DeleteDisk(ctx, disk); err == nil || !strings.Contains(err.Error(), "detach it first") {
		t.Errorf("delete_disk of an attached disk: %v", err)
	}
	// And a VM that was never there is VMNotFound, as before.
	if err := d.DetachDisk(ctx, "vm-00000000-0000-0000-0000-000000000000", disk); !errors.Is(err, driver.ErrVMNotFound) {
		t.Errorf("detach from an unknown vm: %v", err)
	}
}
