package storage

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// MountNamed mounts the ext4 image at dir (through an autoclear loop
// device, with MOUNT_ATTR_ flags attrs) under the source name name: what
// the mount table shows as its device, in every copy made of the mount.
// The BOSH agent finds a persistent disk's mounts by the path its
// settings give (/warden-cpi-dev/<disk>); a loop device's own name would
// tell it nothing.
//
// The kernel records the source as given and looks the device up by it,
// so the mount is made on a thread of its own chrooted into a scratch
// directory where name is the loop device's node.
func MountNamed(image, dir, name string, attrs uint64) error {
	if !filepath.IsAbs(name) || filepath.Clean(name) != name {
		return fmt.Errorf("source name %q is not a clean absolute path", name)
	}
	return withLoop(image, func(dev string) error {
		var st unix.Stat_t
		if err := unix.Stat(dev, &st); err != nil {
			return err
		}
		scratch, err := os.MkdirTemp(filepath.Dir(dir), ".named-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(scratch)
		node := filepath.Join(scratch, name)
		if err := os.MkdirAll(filepath.Dir(node), 0o700); err != nil {
			return err
		}
		if err := unix.Mknod(node, unix.S_IFBLK|0o600, int(st.Rdev)); err != nil {
			return fmt.Errorf("a node for %s: %w", dev, err)
		}
		fs, err := unix.Fsopen("ext4", unix.FSOPEN_CLOEXEC)
		if err != nil {
			return fmt.Errorf("opening ext4 for %s: %w", image, err)
		}
		defer unix.Close(fs)
		err = OnOwnThread(func() error {
			if err := unix.Chroot(scratch); err != nil {
				return err
			}
			if err := unix.FsconfigSetString(fs, "source", name); err != nil {
				return err
			}
			return unix.FsconfigCreate(fs)
		})
		if err != nil {
			return fmt.Errorf("mounting %s: %w", image, err)
		}
		mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, int(attrs))
		if err != nil {
			return fmt.Errorf("mounting %s: %w", image, err)
		}
		defer unix.Close(mnt)
		if err := unix.MoveMount(mnt, "", unix.AT_FDCWD, dir, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
			return fmt.Errorf("mounting %s at %s: %w", image, dir, err)
		}
		return nil
	})
}

// OnOwnThread runs f on a thread of its own with a root and working
// directory of its own (f may chroot, or enter a mount namespace: a Go
// process cannot as a whole). The thread never returns to the scheduler:
// it ends with f.
func OnOwnThread(f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			errc <- err
			return
		}
		errc <- f()
	}()
	return <-errc
}
