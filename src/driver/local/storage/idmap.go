package storage

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"golang.org/x/sys/unix"
)

// IDRange is the host ids a VM's user namespace maps its ids 0..Size-1
// to: root in the VM is host uid (and gid) Base.
type IDRange struct {
	Base, Size uint32
}

// UserNS holds a user namespace with r's mapping open: a process made in
// it (the kernel makes a user namespace only with a process), killed once
// the namespace's file is open.
func (r IDRange) UserNS() (*os.File, error) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		return nil, fmt.Errorf("a user namespace needs a process to hold it: %w", err)
	}
	cmd := exec.Command(sleep, "infinity")
	cmd.Env = []string{}
	m := []syscall.SysProcIDMap{{ContainerID: 0, HostID: int(r.Base), Size: int(r.Size)}}
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWUSER, UidMappings: m, GidMappings: m,
		Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("making a user namespace: %w", err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	return os.Open(fmt.Sprintf("/proc/%d/ns/user", cmd.Process.Pid))
}

// BindIDMapped mounts a copy of directory src at name under dir (opened
// as a root; the mount point is made, or checked to be a directory), its
// owners seen through r:
// a file of uid u under src is uid r.Base+u under name. The mount point
// is reached without following a link (a VM may have planted one). attrs
// are further MOUNT_ATTR_ flags (read-only, nosuid, nodev).
func BindIDMapped(src string, dir *os.Root, name string, r IDRange, attrs uint64) error {
	fd, err := CloneIDMapped(src, r, attrs)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return moveInto(fd, dir, name)
}

// CloneIDMapped answers a detached copy of the mount at src (its owners
// seen through r, attrs set) for the caller to attach and close.
func CloneIDMapped(src string, r IDRange, attrs uint64) (int, error) {
	ns, err := r.UserNS()
	if err != nil {
		return -1, err
	}
	defer ns.Close()
	return CloneIDMappedIn(src, ns, attrs)
}

// CloneIDMappedIn is CloneIDMapped with the owners seen through the user
// namespace ns (IDRange.UserNS).
func CloneIDMappedIn(src string, ns *os.File, attrs uint64) (int, error) {
	fd, err := unix.OpenTree(unix.AT_FDCWD, src, unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_SYMLINK_NOFOLLOW)
	if err != nil {
		return -1, fmt.Errorf("cloning %s: %w", src, err)
	}
	attr := unix.MountAttr{Attr_set: unix.MOUNT_ATTR_IDMAP | attrs, Userns_fd: uint64(ns.Fd())}
	if attrs&unix.MOUNT_ATTR__ATIME != 0 {
		// An access-time mode replaces the mount's: the kernel refuses
		// one set without its field cleared (EINVAL).
		attr.Attr_clr = unix.MOUNT_ATTR__ATIME
	}
	if err := unix.MountSetattr(fd, "", unix.AT_EMPTY_PATH, &attr); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("mapping the owners of %s: %w", src, err)
	}
	return fd, nil
}

// moveInto attaches the detached mount fd at name under dir, a directory
// of the host root's made now (what the mount covers shows for as short a
// time as can be); the target is resolved with no link followed.
func moveInto(fd int, dir *os.Root, name string) error {
	d, err := dir.Open(".")
	if err != nil {
		return err
	}
	defer d.Close()
	if err := MkdirOwned(dir, name, 0o700, 0, 0); err != nil {
		return err
	}
	if err := unix.MoveMount(fd, "", int(d.Fd()), name, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("mounting at %s: %w", name, err)
	}
	return nil
}

// MkdirOwned makes directory name under root (no link followed) owned by
// uid:gid with mode, or checks that it is a directory when it exists; a
// link or file there is replaced.
func MkdirOwned(root *os.Root, name string, mode os.FileMode, uid, gid int) error {
	if fi, err := root.Lstat(name); err == nil {
		if fi.IsDir() {
			return root.Lchown(name, uid, gid)
		}
		if err := root.Remove(name); err != nil {
			return err
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if err := root.Mkdir(name, mode); err != nil {
		return err
	}
	if err := root.Chmod(name, mode); err != nil { // past the umask
		return err
	}
	return root.Lchown(name, uid, gid)
}
