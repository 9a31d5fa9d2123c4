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

// diskImage makes a 16 MiB disk image and the named mount points beside
// it in a directory of the test's own; it answers the directory and the
// image's path.
func diskImage(t *testing.T, mountPoints ...string) (dir, img string) {
	t.Helper()
	dir = t.TempDir()
	img = filepath.Join(dir, "disk.img")
	if err := MakeImage(context.Background(), img, 16, DiskImage, true); err != nil {
		t.Fatal(err)
	}
	mkdirs(t, dir, mountPoints...)
	return dir, img
}

// mountCopy mounts an idmapped copy (CloneIDMapped, IDs from 900000) of
// the mount at from on to.
func mountCopy(t *testing.T, from, to string, attr uint64) {
	t.Helper()
	fd, err := CloneIDMapped(from, IDRange{Base: 900000, Size: 65536}, attr)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.MoveMount(fd, "", unix.AT_FDCWD, to, unix.MOVE_MOUNT_F_EMPTY_PATH)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
}

// mkdirs makes the named directories in dir.
func mkdirs(t *testing.T, dir string, names ...string) {
	t.Helper()
	for _, n := range names {
		if err := os.Mkdir(filepath.Join(dir, n), 0o700); err != nil {
			t.Fatal(err)
		}
	}
}

// The mount table names a MountNamed mount, and every copy of it, as
// asked; its loop device goes with the last of them.
func TestMountNamedNamesEveryCopy(t *testing.T) {
	dir, img := diskImage(t, "held", "copy")
	held, copyAt := filepath.Join(dir, "held"), filepath.Join(dir, "copy")
	for _, bad := range []string{"warden-cpi-dev/disk-1", "/warden-cpi-dev/../disk-1", "/a//b"} {
		if err := MountNamed(img, held, bad, 0); err == nil {
			unix.Unmount(held, unix.MNT_DETACH)
			t.Fatalf("name %q accepted", bad)
		}
	}
	const name = "/warden-cpi-dev/disk-1"
	if err := MountNamed(img, held, name, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(held, unix.MNT_DETACH)
	mountCopy(t, held, copyAt, unix.MOUNT_ATTR_RDONLY)
	defer unix.Unmount(copyAt, unix.MNT_DETACH)
	for _, at := range []string{held, copyAt} {
		if src, err := SourceOf(at); err != nil || src != name {
			t.Errorf("%s: source %q (%v), want %s", at, src, err, name)
		}
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Join(copyAt, "lost+found"), &st); err != nil || st.Uid != 900000 {
		t.Errorf("the copy's owners are not mapped: uid %d (%v)", st.Uid, err)
	}
	if ents, _ := filepath.Glob(filepath.Join(dir, ".named-*")); len(ents) != 0 {
		t.Errorf("scratch left: %v", ents)
	}
	if loops, _ := LoopsOf(img); len(loops) != 1 {
		t.Fatalf("loop devices %v, want one", loops)
	}
	if err := Unmount(copyAt, held); err != nil {
		t.Fatal(err)
	}
	if err := AwaitFree(context.Background(), img, 10*time.Second); err != nil {
		t.Errorf("the loop device outlived its mounts: %v", err)
	}
	b, _ := os.ReadFile("/proc/thread-self/mountinfo")
	if strings.Contains(string(b), name) {
		t.Error("a mount of it is left")
	}
}

// A holder nobody can see — an open file whose mount is gone — keeps the
// file system; the pin finds it and cuts it off with the data flushed.
func TestPinFindsAndCutsOffAnUnseenHolder(t *testing.T) {
	dir, img := diskImage(t, "at")
	at := filepath.Join(dir, "at")
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
	dir, img := diskImage(t, "at")
	at := filepath.Join(dir, "at")
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
	mkdirs(t, dir, "at", "copy")
	at, copyAt := filepath.Join(dir, "at"), filepath.Join(dir, "copy")
	if err := unix.Mount("tmpfs", at, "tmpfs", 0, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(at, unix.MNT_DETACH)
	mountCopy(t, at, copyAt, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NOATIME)
	defer unix.Unmount(copyAt, unix.MNT_DETACH)
	b, _ := os.ReadFile("/proc/thread-self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 5 && f[4] == copyAt && !strings.Contains(f[5], "noatime") {
			t.Errorf("the copy's options: %s", f[5])
		}
	}
}
