package ctrvm

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/driver/local/container"
	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// Taking a disk back from a running VM. The VM's root may have copied
// the disk's mounts anywhere it can make a mount namespace (unshare -m,
// a namespace kept by a bind-mounted or open ns file, one per thread),
// so the VM is frozen and every mount namespace its processes are in or
// hold is entered and cleared of the disk's device. What still keeps the
// file system after that (an open file, a working directory, a mount
// only a descriptor reaches, a mount locked by a nested user namespace)
// is cut off: the file system is flushed and shut down, so the VM can
// neither read nor write it, and the disk keeps its data as it was.

// releaseDisk takes every mount of the ext4 image on device dev out of
// running VM rec (which must be called in its supervisor's namespace,
// where at is the driver's own mount of it) and answers whether the VM
// still held the file system and had to be cut off.
func (v *VMs) releaseDisk(rec store.VM, at, image string, dev uint64) (cut bool, err error) {
	pin, err := storage.PinLoop(dev, image)
	if err != nil {
		return false, err
	}
	defer pin.Close()
	c := v.ctr(rec.CID)
	thaw := freezeCgroup(c.cgroup())
	err = unmountInVM(c, dev)
	thaw()
	if err != nil {
		return false, err
	}
	if err := unix.Unmount(at, 0); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		if err := storage.Unmount(at); err != nil {
			return false, err
		}
	}
	held, err := pin.Held()
	if err != nil || !held {
		return false, err
	}
	if err := pin.ShutDown(filepath.Join(c.run(), ".cut-"+filepath.Base(at))); err != nil {
		return true, fmt.Errorf("vm %s still holds the disk after every mount of it was taken away, and it could not be cut off: %w", rec.CID, err)
	}
	return true, nil
}

// freezeCgroup freezes the VM's processes (cgroup v1 freezer, or v2's
// cgroup.freeze), so none makes a mount namespace while its mounts are
// being taken away, and answers how to thaw them. Freezing is best
// effort: what slips past it is cut off all the same.
func freezeCgroup(cgroup string) (thaw func()) {
	v1 := filepath.Join("/sys/fs/cgroup/freezer", cgroup, "freezer.state")
	if os.WriteFile(v1, []byte("FROZEN"), 0) == nil {
		for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if b, _ := os.ReadFile(v1); strings.TrimSpace(string(b)) == "FROZEN" {
				break
			}
		}
		return func() { _ = os.WriteFile(v1, []byte("THAWED"), 0) }
	}
	for _, root := range []string{"/sys/fs/cgroup", "/sys/fs/cgroup/unified"} {
		v2 := filepath.Join(root, cgroup, "cgroup.freeze")
		if os.WriteFile(v2, []byte("1"), 0) == nil {
			events := filepath.Join(root, cgroup, "cgroup.events")
			for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
				if b, _ := os.ReadFile(events); strings.Contains(string(b), "frozen 1") {
					break
				}
			}
			return func() { _ = os.WriteFile(v2, []byte("0"), 0) }
		}
	}
	return func() {}
}

// nsKey tells mount namespaces apart (their nsfs inode).
type nsKey struct{ dev, ino uint64 }

// unmountInVM unmounts, in every mount namespace VM c's processes (and
// their threads) are in or hold open, every mount of device dev. A mount
// in use is detached lazily; one the namespace's user namespace locked
// stays (the caller cuts the file system off).
func unmountInVM(c ctr, dev uint64) error {
	seen := map[nsKey]bool{}
	var queue []*os.File
	add := func(f *os.File, err error) {
		if err != nil {
			return
		}
		var st unix.Stat_t
		if unix.Fstat(int(f.Fd()), &st) != nil || seen[nsKey{st.Dev, st.Ino}] {
			f.Close()
			return
		}
		if t, err := unix.IoctlRetInt(int(f.Fd()), unix.NS_GET_NSTYPE); err != nil || t != unix.CLONE_NEWNS {
			f.Close()
			return
		}
		seen[nsKey{st.Dev, st.Ino}] = true
		queue = append(queue, f)
	}
	// Our own namespace (the supervisor's) is not the VM's.
	add(os.Open("/proc/thread-self/ns/mnt"))
	for _, f := range queue {
		defer f.Close()
	}
	queue = nil
	for _, pid := range vmPIDs(c) {
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, t := range tasks {
			base := fmt.Sprintf("/proc/%d/task/%s", pid, t.Name())
			add(os.Open(base + "/ns/mnt"))
			fds, _ := os.ReadDir(base + "/fd")
			for _, fd := range fds {
				if l, _ := os.Readlink(base + "/fd/" + fd.Name()); strings.HasPrefix(l, "mnt:[") {
					add(os.Open(base + "/fd/" + fd.Name()))
				}
			}
		}
	}
	proc, err := os.Open("/proc")
	if err != nil {
		return err
	}
	defer proc.Close()
	for len(queue) > 0 {
		ns := queue[0]
		queue = queue[1:]
		var pinned []string
		err := storage.OnOwnThread(func() error {
			defer ns.Close()
			if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
				return nil // gone meanwhile, or not ours to enter
			}
			var err error
			pinned, err = unmountDevice(proc, dev)
			if err != nil {
				return fmt.Errorf("inside vm %s: %w", c.cid, err)
			}
			// Namespaces kept by a bind-mounted ns file: opened here
			// (no link the VM planted on the way followed), entered in
			// their turn.
			for _, p := range pinned {
				fd, err := unix.Openat2(unix.AT_FDCWD, p, &unix.OpenHow{Flags: unix.O_RDONLY | unix.O_NONBLOCK | unix.O_CLOEXEC,
					Resolve: unix.RESOLVE_NO_SYMLINKS})
				if err == nil {
					add(os.NewFile(uintptr(fd), p), nil)
				}
			}
			return nil
		})
		if err != nil {
			for _, f := range queue {
				f.Close()
			}
			return err
		}
	}
	return nil
}

// unmountDevice unmounts, in the calling thread's mount namespace, every
// mount of device dev (innermost first, again while any is left and
// some go), and answers the namespace files bind-mounted in it. proc is
// the host's /proc, opened before the thread left the host's namespace.
func unmountDevice(proc *os.File, dev uint64) (nsFiles []string, err error) {
	for round := 0; round < 8; round++ {
		fd, err := unix.Openat(int(proc.Fd()), "thread-self/mountinfo", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		f := os.NewFile(uintptr(fd), "mountinfo")
		info, err := io.ReadAll(f)
		f.Close()
		if err != nil {
			return nil, err
		}
		if round == 0 {
			nsFiles = storage.NSFileMounts(info)
		}
		paths := storage.MountsOf(info, dev)
		if len(paths) == 0 {
			return nsFiles, nil
		}
		gone := 0
		for _, p := range paths {
			// The VM names these paths: no link of its own is followed.
			err := unix.Unmount(p, unix.UMOUNT_NOFOLLOW)
			if errors.Is(err, unix.EBUSY) {
				err = unix.Unmount(p, unix.UMOUNT_NOFOLLOW|unix.MNT_DETACH)
			}
			if err == nil {
				gone++
			}
		}
		if gone == 0 {
			return nsFiles, nil // locked or gone: left to the cut-off
		}
	}
	return nsFiles, nil
}

// vmPIDs lists the processes of VM c: every process of its cgroups, and
// its init.
func vmPIDs(c ctr) []int {
	seen := map[int]bool{}
	var out []int
	addPID := func(pid int) {
		if pid > 1 && !seen[pid] {
			seen[pid] = true
			out = append(out, pid)
		}
	}
	if b, err := os.ReadFile(filepath.Join(c.dir, "container.pid")); err == nil {
		n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		addPID(n)
	}
	for _, dir := range container.CgroupDirs(c.cgroup()) {
		_ = filepath.WalkDir(dir, func(p string, e os.DirEntry, err error) error {
			if err != nil || !e.IsDir() {
				return nil
			}
			b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				n, _ := strconv.Atoi(f)
				addPID(n)
			}
			return nil
		})
	}
	return out
}
