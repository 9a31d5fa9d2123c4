package ctrvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/driver/local/container"
	"github.com/runway-cpi/runway/src/driver/local/mountsvc"
	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/local/store"
	"github.com/runway-cpi/runway/src/lock"
)

// A stemcell with cloud_properties.persistent_disks: mount_service has an
// agent that mounts its persistent disks itself (agent.json without
// BindMountPersistentDisk), as on a real IaaS: the disk's settings path,
// /warden-cpi-dev/<disk>, is what it mounts and what it then finds in
// /proc/mounts. Its VMs get no bind of the disk: attach_disk mounts the
// disk in the supervisor's namespace under that name (held/<disk>), and
// the VM's mount.ext4 asks the supervisor (package mountsvc) for a copy
// of it where the agent wants it. Every mount of a disk is then a mount
// of its own, named as the settings name it, so the agent's migration to
// a new disk (mount it at /var/vcap/store_migration_target, copy, move it
// to /var/vcap/store) passes the agent's own checks; a bind of a mounted
// directory carries that mount's name, and the agent refuses to mount a
// device it sees mounted elsewhere.

// held is where a mount-service VM's disks are mounted aside.
func (c ctr) held() string { return filepath.Join(c.run(), "held") }

// diskMount answers where a disk attached to VM rec is mounted in its
// supervisor's namespace (at), in directory dir: below devs (what the VM
// sees as /warden-cpi-dev), or below held for a mount-service VM.
func (c ctr) diskMount(rec store.VM, disk string) (at, dir string) {
	dir = c.devs()
	if rec.DiskMounts == store.DiskMountsService {
		dir = c.held()
	}
	return filepath.Join(dir, disk), dir
}

// serveMount is a VM supervisor's mount service handler.
func serveMount(ctx context.Context, vm container.Served, peer unix.Ucred, req mountsvc.Request) error {
	v, rec, err := nsVMs(vm.Dir)
	if err != nil {
		return err
	}
	if v.st.Locks, err = lock.New(vm.Locks, 10*time.Second, nil); err != nil {
		return err
	}
	if v.self, err = os.Executable(); err != nil {
		return err
	}
	return v.mountForVM(ctx, rec, vm.InitPID, peer, req)
}

// maxDiskMounts bounds the mounts of a VM's disks in its namespace that
// the service adds to (the agent needs two or three at a time).
const maxDiskMounts = 32

// mountForVM mounts one of VM rec's attached disks inside it, as its root
// asked: a copy of the disk's mount, its owners seen through the VM's
// ids, nosuid and nodev, at a directory resolved inside the VM's root
// with no magic link followed. The copy is made by a process of the
// VM's cgroups (vmMount), so the kernel counts its memory to the VM.
func (v *VMs) mountForVM(ctx context.Context, rec *store.VM, initPID int, peer unix.Ucred, req mountsvc.Request) error {
	if rec.IDs == nil || peer.Uid != rec.IDs.Base {
		return errors.New("only the vm's root may mount its disks")
	}
	disk, ok := strings.CutPrefix(req.Source, container.DisksDir+"/")
	if !ok || store.CheckCID("disk", disk) != nil {
		return fmt.Errorf("source %q: a disk attached to this vm is %s/<disk> (its agent settings' path)", req.Source, container.DisksDir)
	}
	if !filepath.IsAbs(req.Target) || len(req.Target) > 4096 || strings.ContainsRune(req.Target, 0) {
		return fmt.Errorf("target %q: not an absolute path", req.Target)
	}
	attrs, err := mountsvc.Options(req.Options)
	if err != nil {
		return err
	}
	unlock, err := v.st.Lock(ctx, store.Disks, disk)
	if err != nil {
		return err
	}
	defer unlock()
	dr, err := v.st.LoadDisk(disk)
	if err != nil || dr.AttachedTo != rec.CID {
		return fmt.Errorf("disk %s is not attached to this vm", disk)
	}
	held, _ := v.ctr(rec.CID).diskMount(*rec, disk)
	if !storage.IsMountPoint(held) {
		return fmt.Errorf("disk %s is not ready in this vm yet (its attach_disk has not finished)", disk)
	}
	info, err := os.ReadFile(fmt.Sprintf("/proc/%d/mountinfo", initPID))
	if err != nil {
		return errors.New("the vm is not running")
	}
	if n := len(storage.MountsFrom(info, container.DisksDir+"/")); n >= maxDiskMounts {
		return fmt.Errorf("the vm has %d mounts of its disks already (at most %d): unmount one first", n, maxDiskMounts)
	}
	cmd := v.nsCommand(ctx, rec, nsMount, disk, nil, nsInitEnv+"="+strconv.Itoa(initPID), nsTargetEnv+"="+req.Target,
		nsAttrsEnv+"="+strconv.FormatUint(attrs, 10))
	if out, err := container.RunChild(ctx, cmd); err != nil {
		if msg := strings.TrimSpace(string(out)); msg != "" {
			return errors.New(msg)
		}
		return fmt.Errorf("mounting disk %s: %w", disk, err)
	}
	v.st.Log.Info("disk mounted in the vm at its request", "vm", rec.CID, "disk", disk, "target", req.Target)
	return nil
}

// vmMount is the mount service's mount itself, in a process of its own
// (the supervisor's child) that joins VM rec's cgroups first: the mount
// it makes is then the VM's kernel memory, under the VM's limits.
func (v *VMs) vmMount(rec *store.VM, disk string, initPID int, target string, attrs uint64) error {
	c := v.ctr(rec.CID)
	held, _ := c.diskMount(*rec, disk)
	// The user namespace's holder process starts before this one joins
	// the VM (it must not count against the VM's pids).
	userNS, err := rec.IDs.UserNS()
	if err != nil {
		return err
	}
	defer userNS.Close()
	pid := []byte(strconv.Itoa(os.Getpid()))
	for _, dir := range container.CgroupDirs(c.cgroup()) {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), pid, 0); err != nil {
			return fmt.Errorf("joining the vm's cgroup %s: %w", dir, err)
		}
	}
	// The VM's init is the supervisor's child: a pid reused by anything
	// else is not entered.
	pidfd, err := unix.PidfdOpen(initPID, 0)
	if err != nil || parentOf(initPID) != os.Getppid() {
		return errors.New("the vm is not running")
	}
	defer unix.Close(pidfd)
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", initPID))
	if err != nil || unix.PidfdSendSignal(pidfd, 0, nil, 0) != nil {
		return errors.New("the vm is not running")
	}
	defer ns.Close()
	fd, err := storage.CloneIDMappedIn(held, userNS, attrs)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return inMountNS(ns, func() error {
		// The namespace's root is the VM's: the target resolves inside
		// it, a /proc magic link refused.
		t, err := unix.Openat2(unix.AT_FDCWD, target, &unix.OpenHow{Flags: unix.O_PATH | unix.O_DIRECTORY | unix.O_CLOEXEC,
			Resolve: unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS})
		if err != nil {
			return fmt.Errorf("target %s: %w", target, err)
		}
		defer unix.Close(t)
		if err := unix.MoveMount(fd, "", t, "", unix.MOVE_MOUNT_F_EMPTY_PATH|unix.MOVE_MOUNT_T_EMPTY_PATH); err != nil {
			return fmt.Errorf("mounting disk %s at %s: %w", disk, target, err)
		}
		return nil
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

// inMountNS runs f on a thread of its own inside the mount namespace ns.
func inMountNS(ns *os.File, f func() error) error {
	return storage.OnOwnThread(func() error {
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("entering the vm's mount namespace: %w", err)
		}
		return f()
	})
}
