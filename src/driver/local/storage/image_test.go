package storage

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// fill writes to path until a write fails, answering the bytes written
// and the error.
func fill(t *testing.T, path string) (int64, error) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	var n int64
	for n < 1<<30 {
		w, err := f.Write(buf)
		n += int64(w)
		if err == nil {
			err = f.Sync()
		}
		if err != nil {
			return n, err
		}
	}
	t.Fatal("wrote 1 GiB without an error")
	return n, nil
}

func fsSize(t *testing.T, dir string) int64 {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	return int64(st.Blocks) * st.Bsize
}

// An image holds at most its size: a writer filling it gets ENOSPC and the
// file around it (the state dir) gains nothing past the image's size, all
// of which it took when made. A clone of a template is a file system of
// its own; a grown one (offline and online) has the new size.
func TestImagesHoldTheirSizeAndGrow(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	tmpl, img := filepath.Join(dir, "tmpl.img"), filepath.Join(dir, "layer.img")
	if err := MakeImage(ctx, tmpl, 64, LayerImage, true); err != nil {
		t.Fatal(err)
	}
	if a, _ := Allocated(tmpl); a > 4<<20 {
		t.Errorf("the template takes %d bytes: it should hold only what mkfs wrote", a)
	}
	if err := CloneImage(tmpl, img, 64); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	unix.Stat(img, &st)
	if st.Size != 64<<20 || st.Blocks*512 < 64<<20 {
		t.Fatalf("clone: %d bytes, %d allocated", st.Size, st.Blocks*512)
	}
	mnt := filepath.Join(dir, "mnt")
	os.Mkdir(mnt, 0o700)
	if err := MountLoop(img, mnt, unix.MS_NODEV, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	n, err := fill(t, filepath.Join(mnt, "big"))
	if !errors.Is(err, unix.ENOSPC) || n > 64<<20 {
		t.Errorf("wrote %d bytes into a 64 MiB image, then %v", n, err)
	}
	unix.Stat(img, &st)
	if st.Blocks*512 > 65<<20 {
		t.Errorf("the image file grew to %d bytes on the host", st.Blocks*512)
	}
	// The template was not touched.
	if _, err := os.Stat(tmpl); err != nil {
		t.Fatal(err)
	}

	disk := filepath.Join(dir, "disk.img")
	if err := MakeImage(ctx, disk, 32, DiskImage, false); err != nil {
		t.Fatal(err)
	}
	dmnt := filepath.Join(dir, "disk")
	os.Mkdir(dmnt, 0o700)
	if err := MountLoop(disk, dmnt, 0, ""); err != nil {
		t.Fatal(err)
	}
	before := fsSize(t, dmnt)
	os.WriteFile(filepath.Join(dmnt, "kept"), []byte("data"), 0o600)
	unix.Unmount(dmnt, 0)
	if err := GrowImage(ctx, disk, 48); err != nil {
		t.Fatal(err)
	}
	if err := MountLoop(disk, dmnt, 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(dmnt, unix.MNT_DETACH)
	if after := fsSize(t, dmnt); after < before+14<<20 {
		t.Errorf("grown from 32 to 48 MiB: the file system went from %d to %d bytes", before, after)
	}
	if b, _ := os.ReadFile(filepath.Join(dmnt, "kept")); string(b) != "data" {
		t.Errorf("the data after growing: %q", b)
	}
}

// Many processes take loop devices at once (the Director's parallel
// create_vm calls): every one gets a device, however many ask before any
// lets go, and none loses a race for one to another (each would cost a
// try; 40 processes once used up 20 tries). Each caller here holds its
// device until all have one.
func TestLoopDevicesForManyAtOnce(t *testing.T) {
	const callers = 64
	lost := lostRaces.Load()
	dir := t.TempDir()
	var arrived sync.WaitGroup
	arrived.Add(callers)
	errs := make(chan error, callers)
	var devs sync.Map
	var done sync.WaitGroup
	start := make(chan struct{})
	for i := range callers {
		img := filepath.Join(dir, fmt.Sprintf("img-%d", i))
		if err := os.WriteFile(img, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Truncate(img, 1<<20); err != nil {
			t.Fatal(err)
		}
		done.Add(1)
		go func() {
			defer done.Done()
			<-start
			got := false
			err := withLoop(img, func(dev string) error {
				got = true
				if _, dup := devs.LoadOrStore(dev, img); dup {
					return fmt.Errorf("%s handed out twice", dev)
				}
				arrived.Done()
				arrived.Wait() // hold the device until every caller has one
				return nil
			})
			if !got {
				arrived.Done()
			}
			errs <- err
		}()
	}
	close(start)
	done.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	if n := lostRaces.Load() - lost; n != 0 {
		t.Errorf("callers lost %d races for a free device to each other", n)
	}
}
