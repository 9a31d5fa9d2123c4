package ctrvm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/driver/local/container"
	"github.com/runway-cpi/runway/src/driver/local/procs"
	"github.com/runway-cpi/runway/src/driver/local/store"
	"github.com/runway-cpi/runway/src/logging"
)

// A container VM's file systems (its root overlay, its disks) are mounted
// in its supervisor's own mount namespace, never in the host's: the host's
// mount table stays the same whatever the number of VMs (every runc
// create copies it), and they go with the VM. What bin/cpi must do in
// there later (attach or detach a disk while the VM runs) it does through
// the driver's executable started again inside that namespace (nsenter).

// Env names the operation the driver's executable was started for inside
// a VM's mount namespace; nsDirEnv the VM's directory, nsDiskEnv a disk.
const (
	nsOpEnv   = "RUNWAY_VM_NS_OP"
	nsDirEnv  = "RUNWAY_VM_NS_DIR"
	nsDiskEnv = "RUNWAY_VM_NS_DISK"
	// The mount service's mount (vmMount): the VM's init, the target
	// inside it, the mount's attributes.
	nsMount     = "mount"
	nsInitEnv   = "RUNWAY_VM_NS_INIT"
	nsTargetEnv = "RUNWAY_VM_NS_TARGET"
	nsAttrsEnv  = "RUNWAY_VM_NS_ATTRS"
)

// Supervised runs what the driver's executable may be started again for
// on a container VM's behalf — its supervisor, an operation inside its
// mount namespace — and exits; otherwise it returns at once.
func Supervised() {
	container.Supervised(prepareInNS, serveMount)
	if op := os.Getenv(nsOpEnv); op != "" {
		// As the supervisor's: no namespace or root entered on a thread
		// of its own may land on the main thread (/proc/self's).
		runtime.LockOSThread()
		if err := nsOp(op, os.Getenv(nsDirEnv), os.Getenv(nsDiskEnv)); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
}

// nsVMs are container VMs as the supervisor or an operation inside a
// VM's namespace needs them: their state dir (dir is <state>/vms/<cid>)
// and the VM's record.
func nsVMs(dir string) (*VMs, *store.VM, error) {
	root := filepath.Dir(filepath.Dir(dir))
	v := &VMs{st: &store.Store{Root: root, Log: logging.Fields{Logger: logging.Discard(), Tag: "local"}}}
	rec, err := v.st.LoadVM(filepath.Base(dir))
	return v, rec, err
}

// prepareInNS mounts the VM's file systems and writes what the agent
// reads, in the supervisor's namespace, before its container is made.
func prepareInNS(dir string) error {
	v, rec, err := nsVMs(dir)
	if err != nil {
		return err
	}
	if err := v.mountVM(*rec); err != nil {
		return err
	}
	userData, err := os.ReadFile(filepath.Join(dir, "user-data"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return v.writeInside(*rec, v.settingsOf(rec.CID), string(userData))
}

// nsOp runs an operation inside a running VM's mount namespace.
func nsOp(op, dir, disk string) error {
	v, rec, err := nsVMs(dir)
	if err != nil {
		return err
	}
	switch op {
	case nsMount:
		init, _ := strconv.Atoi(os.Getenv(nsInitEnv))
		attrs, _ := strconv.ParseUint(os.Getenv(nsAttrsEnv), 10, 64)
		return v.vmMount(rec, disk, init, os.Getenv(nsTargetEnv), attrs)
	case "attach":
		if _, err := v.attachInside(*rec, disk); err != nil {
			return err
		}
	case "detach":
		cut, err := v.detachInside(*rec, disk)
		if cut {
			fmt.Println(cutOff)
		}
		if err != nil {
			return err
		}
	default:
		return fmt.Errorf("no operation %q in a vm's namespace", op)
	}
	return v.syncSettings(*rec)
}

// cutOff is what the detach operation prints when the VM still held the
// disk's file system after its mounts were taken away (releaseDisk).
const cutOff = "cut-off"

// inVM runs op on disk inside VM rec's mount namespace, when it runs
// (answering "" when it does not: its file systems are mounted when it
// starts), and answers what op printed. The supervisor is checked to be
// the VM's before entering.
func (v *VMs) inVM(ctx context.Context, rec *store.VM, op, disk string) (string, error) {
	c := v.ctr(rec.CID)
	pid := procs.ReadPGID(c.dir)
	if pid <= 1 {
		return "", nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return "", nil // gone
	}
	defer unix.Close(fd)
	if !procs.HasMarker(pid, rec.CID) {
		return "", nil
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/mnt", pid))
	if err != nil {
		return "", nil
	}
	defer ns.Close()
	cmd := v.nsCommand(ctx, rec, op, disk, ns)
	var out, errs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errs
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("%s of disk %s inside vm %s: %w: %s", op, disk, rec.CID, err, strings.TrimSpace(errs.String()))
	}
	return out.String(), nil
}

// nsCommand is the driver's executable started for operation op on disk
// of VM rec (nsOp), with more of the operation's variables: inside the
// VM's mount namespace through nsenter when ns is that namespace's file,
// else in the caller's (the supervisor's, which is the VM's; its
// container.RunChild follows ctx).
func (v *VMs) nsCommand(ctx context.Context, rec *store.VM, op, disk string, ns *os.File, more ...string) *exec.Cmd {
	cmd := exec.Command(v.self)
	if ns != nil {
		cmd = exec.CommandContext(ctx, "nsenter", "--mount=/proc/self/fd/3", "--", v.self)
		cmd.ExtraFiles = []*os.File{ns}
	}
	cmd.Env = append([]string{"PATH=" + procs.VMPath, procs.EnvMarker + "=" + rec.CID, nsOpEnv + "=" + op,
		nsDirEnv + "=" + v.st.Dir(store.VMs, rec.CID), nsDiskEnv + "=" + disk}, more...)
	return cmd
}

// vmPathOf is path (absolute, in the host's view of a VM's mount points)
// as the host reaches it in the running VM's namespace, through its
// supervisor: "" when the VM does not run.
func (v *VMs) vmPathOf(rec *store.VM, path string) string {
	pid := procs.ReadPGID(v.ctr(rec.CID).dir)
	if pid <= 1 || !procs.HasMarker(pid, rec.CID) {
		return ""
	}
	return filepath.Join(fmt.Sprintf("/proc/%d/root", pid), path)
}
