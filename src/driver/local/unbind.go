package local

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/driver/local/storage"
)

// unbindInVM unmounts, inside running VM cid's own mount namespace, every
// mount of the file system dev that the VM made itself: the BOSH agent
// binds /warden-cpi-dev/<disk> at /var/vcap/store. Taking the disk from
// /warden-cpi-dev alone left the VM holding it after detach_disk, and
// resize_disk then grew the file system under that mount (the Director's
// enable_cpi_resize_disk: a second mount of the grown image beside the
// old one). A mount still busy is detached lazily, as a volume is
// force-detached: the file system goes with its last open file, and until
// then attach_disk and resize_disk refuse the disk (storage.AwaitFree).
func (d *Driver) unbindInVM(cid string, dev uint64) error {
	c := d.ctr(cid)
	sup := readPGID(c.dir)
	b, _ := os.ReadFile(filepath.Join(c.dir, "container.pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if pid <= 1 || sup <= 1 {
		return nil // not running: nothing of it is mounted
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil // gone
	}
	defer unix.Close(fd)
	// The VM's init is its supervisor's child (a subreaper): a pid reused
	// by anything else is not entered.
	if parentOf(pid) != sup || !hasMarker(sup, cid) {
		return nil
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return nil
	}
	defer ns.Close()
	info, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", pid))
	if err != nil || unix.PidfdSendSignal(fd, 0, nil, 0) != nil {
		return nil // ended meanwhile
	}
	paths := storage.MountsOf(info, dev)
	if len(paths) == 0 {
		return nil
	}
	return inMountNS(ns, func() error {
		for _, p := range paths {
			// The VM names these paths: no link of its own is followed.
			err := unix.Unmount(p, unix.UMOUNT_NOFOLLOW)
			if err == unix.EBUSY {
				err = unix.Unmount(p, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH)
			}
			if err != nil && err != unix.EINVAL && err != unix.ENOENT {
				return fmt.Errorf("unmounting %s inside vm %s: %w", p, cid, err)
			}
		}
		return nil
	})
}

// inMountNS runs f on a thread of its own inside the mount namespace ns.
func inMountNS(ns *os.File, f func() error) error {
	return storage.OnOwnThread(func() error {
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("entering the vm's mount namespace: %w", err)
		}
		return f()
	})
}

// parentOf answers pid's parent, 0 when it cannot tell.
func parentOf(pid int) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PPid:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}
