package storage

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A holder nobody can see — an open file whose mount is gone — keeps the
// file system; the pin finds it and cuts it off with the data flushed.
func TestPinFindsAndCutsOffAnUnseenHolder(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	if err := MakeImage(context.Background(), img, 16, DiskImage, true); err != nil {
		t.Fatal(err)
	}
	at := filepath.Join(dir, "at")
	if err := os.Mkdir(at, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := MountLoop(img, at, unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(at, unix.MNT_DETACH)
	var st unix.Stat_t
	if err := unix.Stat(at, &st); err != nil {
		t.Fatal(err)
	}
	held, err := os.OpenFile(filepath.Join(at, "kept"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if _, err := held.WriteString("before\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := PinLoop(st.Dev, filepath.Join(dir, "at")); err == nil {
		t.Error("a pin of another file's device was made")
	}
	pin, err := PinLoop(st.Dev, img)
	if err != nil {
		t.Fatal(err)
	}
	defer pin.Close()
	if h, err := pin.Held(); err != nil || !h {
		t.Fatalf("mounted: held %v (%v)", h, err)
	}
	if err := Unmount(at); err != nil {
		t.Fatal(err)
	}
	if h, err := pin.Held(); err != nil || !h {
		t.Fatalf("an open file keeps it: held %v (%v)", h, err)
	}
	if err := pin.ShutDown(filepath.Join(dir, "scratch")); err != nil {
		t.Fatal(err)
	}
	if _, err := held.WriteString("after\n"); !errors.Is(err, unix.EIO) {
		t.Errorf("a write after the cut-off: %v, want EIO", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "scratch")); !os.IsNotExist(err) {
		t.Errorf("the scratch mount point is left: %v", err)
	}
	held.Close()
	if h, err := pin.Held(); err != nil || h {
		t.Errorf("after its last holder: held %v (%v)", h, err)
	}
	pin.Close()
	if err := AwaitFree(context.Background(), img, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// What was written before the cut-off is on the image.
	if err := MountLoop(img, at, unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(at, "kept"))
	if err != nil || string(b) != "before\n" {
		t.Errorf("the data: %q %v", b, err)
	}
}

// An unheld device is told apart: nothing cut off.
func TestPinSeesAFreeFileSystem(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	if err := MakeImage(context.Background(), img, 16, DiskImage, true); err != nil {
		t.Fatal(err)
	}
	at := filepath.Join(dir, "at")
	if err := os.Mkdir(at, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := MountLoop(img, at, 0, ""); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Stat(at, &st); err != nil {
		t.Fatal(err)
	}
	pin, err := PinLoop(st.Dev, img)
	if err != nil {
		t.Fatal(err)
	}
	if err := Unmount(at); err != nil {
		t.Fatal(err)
	}
	if h, err := pin.Held(); err != nil || h {
		t.Errorf("held %v (%v) with no mount or open file", h, err)
	}
	pin.Close()
	if err := AwaitFree(context.Background(), img, 10*time.Second); err != nil {
		t.Error(err)
	}
}

// An access-time mode through an idmapped copy (the mount service's
// noatime): refused with EINVAL before its field was cleared.
func TestCloneIDMappedTakesAnAccessTimeMode(t *testing.T) {
	dir := t.TempDir()
	at, copyAt := filepath.Join(dir, "at"), filepath.Join(dir, "copy")
	for _, d := range []string{at, copyAt} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := unix.Mount("tmpfs", at, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(at, unix.MNT_DETACH)
	fd, err := CloneIDMapped(at, IDRange{Base: 900000, Size: 65536}, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOATIME)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.MoveMount(fd, "", unix.AT_FDCWD, copyAt, unix.MOVE_MOUNT_F_EMPTY_PATH)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(copyAt, unix.MNT_DETACH)
	b, _ := os.ReadFile("/proc/thread-self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[4] == copyAt && !strings.Contains(f[5], "noatime") {
			t.Errorf("the copy's options: %s", f[5])
		}
	}
}
