package storage

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// A disk given back must be gone from whoever had it. Unmounting takes
// away the mounts one can find; a file held open, a process's working
// directory or a mount in a namespace only a descriptor reaches keep the
// file system alive unseen. A Pin tells whether anything still has it
// and, if so, cuts every holder off at once.

// fsIocShutdown is FS_IOC_SHUTDOWN (_IOR('X', 125, __u32)); goingDefault
// flushes data and metadata before the file system stops.
const (
	fsIocShutdown = 0x8004587d
	goingDefault  = 0
)

// Pin holds an image's loop device bound to it (an autoclear device is
// freed with its last file system) while its mounts are taken away.
type Pin struct {
	dev  *os.File
	path string
}

// PinLoop opens the loop device whose device number is dev, checking
// that image is what it holds.
func PinLoop(dev uint64, image string) (*Pin, error) {
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(dev), unix.Minor(dev)))
	if err != nil {
		return nil, fmt.Errorf("device %d:%d: %w", unix.Major(dev), unix.Minor(dev), err)
	}
	path := "/dev/" + filepath.Base(link)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Stat(image, &st); err != nil {
		f.Close()
		return nil, err
	}
	var fst unix.Stat_t
	info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
	if err == nil {
		err = unix.Fstat(int(f.Fd()), &fst)
	}
	if err != nil || fst.Rdev != dev || info.Device != st.Dev || info.Inode != st.Ino {
		f.Close()
		return nil, fmt.Errorf("%s does not hold %s", path, image)
	}
	return &Pin{dev: f, path: path}, nil
}

// Close lets the device go (freed if no file system has it).
func (p *Pin) Close() error { return p.dev.Close() }

// Held reports whether a file system is still on the device: mounted
// somewhere, or kept alive by an open file after its last mount went.
func (p *Pin) Held() (bool, error) {
	f, err := os.OpenFile(p.path, os.O_RDONLY|unix.O_EXCL, 0)
	if errors.Is(err, unix.EBUSY) {
		return true, nil
	}
	if err != nil {
		return false, err
	}
	return false, f.Close()
}

// ShutDown flushes the file system still on the device to it, then stops
// it: every read and write through any of its mounts and open files fails
// from then on. It mounts the device at scratch (a new directory), which
// gives the live file system itself, for as long as the call takes.
func (p *Pin) ShutDown(scratch string) error {
	if err := os.Mkdir(scratch, 0o700); err != nil {
		return err
	}
	defer os.Remove(scratch)
	if err := unix.Mount(p.path, scratch, "ext4", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("reaching the file system on %s: %w", p.path, err)
	}
	defer func() { _ = unix.Unmount(scratch, unix.MNT_DETACH) }()
	root, err := os.Open(scratch)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := unix.IoctlSetPointerInt(int(root.Fd()), fsIocShutdown, goingDefault); err != nil {
		return fmt.Errorf("shutting the file system on %s down: %w", p.path, err)
	}
	return nil
}
