package storage

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The mount table names a MountNamed mount, and every copy of it, as
// asked; its loop device goes with the last of them.
func TestMountNamedNamesEveryCopy(t *testing.T) {
	dir := t.TempDir()
	img := filepath.Join(dir, "disk.img")
	if err := MakeImage(context.Background(), img, 16, DiskImage, true); err != nil {
		t.Fatal(err)
	}
	held, copyAt := filepath.Join(dir, "held"), filepath.Join(dir, "copy")
	for _, d := range []string{held, copyAt} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
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
	fd, err := CloneIDMapped(held, IDRange{Base: 900000, Size: 65536}, unix.MOUNT_ATTR_RDONLY)
	if err != nil {
		t.Fatal(err)
	}
	err = unix.MoveMount(fd, "", unix.AT_FDCWD, copyAt, unix.MOVE_MOUNT_F_EMPTY_PATH)
	unix.Close(fd)
	if err != nil {
		t.Fatal(err)
	}
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
