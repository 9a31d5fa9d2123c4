package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/storage"
)

// diskRecord is disks/<cid>/disk.json; AttachedTo is the one source of
// truth for attachments (the VM's disks/ symlinks are derived from it).
type diskRecord struct {
	CID        string            `json:"cid"`
	SizeMiB    int               `json:"size_mib"`
	CloudProps driver.Props      `json:"cloud_properties"`
	Tags       map[string]string `json:"tags"`
	Metadata   map[string]string `json:"metadata"`
	AttachedTo string            `json:"attached_to,omitempty"`
	// Format: "ext4" for a file system image (disk.img, made in container
	// mode: a device of its own in the VM, its size enforced); empty for
	// a directory (data/, process mode).
	Format string `json:"format,omitempty"`
	// HeldBy is the VM that kept the disk's file system past its
	// detach_disk and was cut off from it; the disk is used again once
	// that VM lets go of it.
	HeldBy    string `json:"held_by,omitempty"`
	NearVM    string `json:"near_vm,omitempty"`
	CreatedAt string `json:"created_at"`
}

func (d *Driver) loadDisk(cid string) (*diskRecord, error) { return load[diskRecord](d, disks, cid) }

// checkSpace answers NoDiskSpace when the state dir's file system cannot
// hold sizeMiB more and still keep its reserve free.
func (d *Driver) checkSpace(sizeMiB int) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(d.root, &st); err != nil {
		return err
	}
	free := st.Bavail * uint64(st.Bsize) >> 20
	if uint64(sizeMiB)+storage.ReserveBytes>>20 > free {
		return fmt.Errorf("%w: %d MiB requested, %d MiB free in %s, %d MiB of which are kept free", driver.ErrNoDiskSpace,
			sizeMiB, free, d.root, storage.ReserveBytes>>20)
	}
	return nil
}

// CreateDisk implements driver.Driver.
func (d *Driver) CreateDisk(ctx context.Context, spec driver.DiskSpec) (string, error) {
	if spec.VMCID != "" {
		if err := checkCID("vm", spec.VMCID); err != nil {
			return "", err
		}
	}
	if err := checkDiskProps(spec.CloudProps); err != nil {
		return "", err
	}
	if err := d.checkSpace(spec.SizeMiB); err != nil {
		return "", err
	}
	cid, err := newCID("disk-")
	if err != nil {
		return "", err
	}
	unlock, err := d.lock(ctx, disks, cid)
	if err != nil {
		return "", err
	}
	defer unlock()
	rec := diskRecord{CID: cid, SizeMiB: spec.SizeMiB, CloudProps: spec.CloudProps, Tags: spec.Tags,
		Metadata: map[string]string{}, NearVM: spec.VMCID, CreatedAt: now()}
	tmp, err := d.stage(disks, cid)
	if err != nil {
		return "", err
	}
	if d.containers() {
		// An ext4 image of the disk's size, all of it allocated now.
		rec.Format = diskFormatExt4
		if err := storage.MakeImage(ctx, filepath.Join(tmp, diskImage), spec.SizeMiB, storage.DiskImage, false); err != nil {
			_ = os.RemoveAll(tmp)
			return "", err
		}
	} else {
		// The data dir is the disk's root inside a VM (/var/vcap/store):
		// 0755, as a fresh file system's root, so the jobs' users can
		// reach their directories on it. The disk's own directory stays
		// 0700.
		if err := os.Mkdir(filepath.Join(tmp, "data"), 0o755); err != nil {
			_ = os.RemoveAll(tmp)
			return "", err
		}
		if err := os.Chmod(filepath.Join(tmp, "data"), 0o755); err != nil {
			_ = os.RemoveAll(tmp)
			return "", err
		}
	}
	if err := d.publish(disks, cid, tmp, rec); err != nil {
		return "", err
	}
	return cid, nil
}

// DeleteDisk implements driver.Driver.
func (d *Driver) DeleteDisk(ctx context.Context, cid string) error {
	rec, unlock, err := lockAndLoad[diskRecord](ctx, d, disks, cid)
	if err != nil {
		return err
	}
	defer unlock()
	// A VM that is gone holds nothing (a call killed half-way can leave
	// its record naming one): only a live VM's attachment stops a delete.
	if rec.AttachedTo != "" && d.vmExists(rec.AttachedTo) {
		return fmt.Errorf("disk %s is attached to vm %s: detach it first", cid, rec.AttachedTo)
	}
	if err := d.awaitFree(ctx, rec); err != nil {
		return err
	}
	defer d.sweep(disks)
	return d.remove(disks, cid)
}

// HasDisk implements driver.Driver.
func (d *Driver) HasDisk(_ context.Context, cid string) (bool, error) {
	return d.has(disks, cid)
}

// lockPair takes the VM lock, then the disk lock: always in that order, so
// two processes never deadlock.
func (d *Driver) lockPair(ctx context.Context, vm, disk string) (func(), error) {
	if err := checkCID("vm", vm); err != nil {
		return nil, err
	}
	if err := checkCID("disk", disk); err != nil {
		return nil, err
	}
	uv, err := d.lock(ctx, vms, vm)
	if err != nil {
		return nil, err
	}
	ud, err := d.lock(ctx, disks, disk)
	if err != nil {
		uv()
		return nil, err
	}
	return func() { ud(); uv() }, nil
}

func (d *Driver) linkPath(vm, disk string) string {
	return filepath.Join(d.path(vms, vm), "disks", disk)
}

// AttachDisk implements driver.Driver; the hint is the path where the disk
// appears inside the VM's directory.
func (d *Driver) AttachDisk(ctx context.Context, vm, disk string) (any, error) {
	unlock, err := d.lockPair(ctx, vm, disk)
	if err != nil {
		return nil, err
	}
	defer unlock()
	vmRec, err := d.loadVM(vm)
	if err != nil {
		return nil, err
	}
	rec, err := d.loadDisk(disk)
	if err != nil {
		return nil, err
	}
	if rec.AttachedTo != "" && rec.AttachedTo != vm {
		return nil, fmt.Errorf("disk %s is already attached to vm %s", disk, rec.AttachedTo)
	}
	if rec.Format == diskFormatExt4 && vmRec.Isolation != IsolationContainer {
		return nil, fmt.Errorf("disk %s is a file system image, made in container mode: attach it to a container vm (vm %s is a process vm)", disk, vm)
	}
	link := d.linkPath(vm, disk)
	before := rec.AttachedTo
	rec.AttachedTo = vm
	if err := d.save(disks, rec.CID, rec); err != nil {
		return nil, err
	}
	target := filepath.Join(d.path(disks, disk), "data")
	if cur, err := os.Readlink(link); err != nil || cur != target {
		_ = os.Remove(link)
		if err := os.Symlink(target, link); err != nil {
			return nil, fmt.Errorf("linking disk %s into vm %s: %w", disk, vm, err)
		}
	}
	where, err := d.isoOf(vmRec).attach(ctx, vmRec, disk)
	if err != nil && before == "" {
		// Refused (the disk still held elsewhere) or failed: nothing of it
		// stays in the VM, and the record says so.
		if _, derr := d.isoOf(vmRec).detach(ctx, vmRec, disk); derr != nil {
			return nil, errors.Join(err, derr)
		}
		rec.AttachedTo = ""
		_ = os.Remove(link)
		return nil, errors.Join(err, d.save(disks, rec.CID, rec))
	}
	if err != nil {
		return nil, err
	}
	return map[string]any{"path": where}, nil
}

// DetachDisk implements driver.Driver.
func (d *Driver) DetachDisk(ctx context.Context, vm, disk string) error {
	unlock, err := d.lockPair(ctx, vm, disk)
	if err != nil {
		return err
	}
	defer unlock()
	rec, err := d.loadDisk(disk)
	if err != nil {
		return err
	}
	vmRec, err := d.loadVM(vm)
	if errors.Is(err, driver.ErrVMNotFound) && rec.AttachedTo == vm && !d.vmExists(vm) {
		// The VM went without clearing the record (a call killed
		// half-way): detaching from it is only forgetting it.
		rec.AttachedTo = ""
		return d.save(disks, rec.CID, rec)
	}
	if err != nil {
		return err
	}
	if rec.AttachedTo == vm {
		// Out of the VM first: the record says attached until it is.
		cut, err := d.isoOf(vmRec).detach(ctx, vmRec, disk)
		if err != nil {
			return err
		}
		if cut {
			rec.HeldBy = vm
			d.log.Warn("the vm still held the disk after every mount of it was taken away (an open file, a working directory or a mount it hid): its file system was flushed and shut down there, so the vm can neither read nor write it, and the disk keeps its data as of now; attach_disk, resize_disk, snapshot_disk and delete_disk wait for the vm to let go of it (delete the vm)",
				"vm", vm, "disk", disk)
		}
	}
	if rec.AttachedTo != vm {
		return fmt.Errorf("%w: disk %s is not attached to vm %s", driver.ErrDiskNotAttached, disk, vm)
	}
	rec.AttachedTo = ""
	if err := d.save(disks, rec.CID, rec); err != nil {
		return err
	}
	if err := os.Remove(d.linkPath(vm, disk)); err != nil && !isNotExist(err) {
		return err
	}
	return nil
}

// clearAttachment detaches a disk from a VM being deleted (VM lock held).
func (d *Driver) clearAttachment(ctx context.Context, vm, disk string) error {
	if checkCID("disk", disk) != nil {
		return os.Remove(d.linkPath(vm, disk))
	}
	unlock, err := d.lock(ctx, disks, disk)
	if err != nil {
		return err
	}
	defer unlock()
	rec, err := d.loadDisk(disk)
	if err == nil && rec.AttachedTo == vm {
		rec.AttachedTo = ""
		if err := d.save(disks, rec.CID, rec); err != nil {
			return err
		}
	}
	return nil
}

// GetDisks implements driver.Driver: the disks whose records name the VM
// (the records, not the VM's links, are the truth).
func (d *Driver) GetDisks(_ context.Context, vm string) ([]string, error) {
	if _, err := d.loadVM(vm); err != nil {
		return nil, err
	}
	return d.disksAttachedTo(vm)
}

// disksAttachedTo lists the disks whose records say attached to vm.
func (d *Driver) disksAttachedTo(vm string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(d.root, disks.dir))
	if err != nil && !isNotExist(err) {
		return nil, err
	}
	out := []string{}
	for _, e := range entries {
		if checkCID("disk", e.Name()) != nil {
			continue // a .creating- or .deleting- directory
		}
		if rec, err := d.loadDisk(e.Name()); err == nil && rec.AttachedTo == vm {
			out = append(out, rec.CID)
		}
	}
	return out, nil
}

// vmExists: a VM published or being created (its create holds the name).
func (d *Driver) vmExists(vm string) bool {
	for _, p := range []string{d.path(vms, vm), filepath.Join(d.root, vms.dir, ".creating-"+vm)} {
		if _, err := os.Lstat(p); err == nil {
			return true
		}
	}
	return false
}

// ResizeDisk implements driver.Driver: grow only.
func (d *Driver) ResizeDisk(ctx context.Context, cid string, size int) error {
	_, err := d.update(ctx, cid, size, nil)
	return err
}

// UpdateDisk implements driver.Driver: size (grow only) and cloud
// properties change in place, so the CID stays.
func (d *Driver) UpdateDisk(ctx context.Context, cid string, size int, props driver.Props) (string, error) {
	if err := checkDiskProps(props); err != nil {
		return "", err
	}
	return d.update(ctx, cid, size, &props)
}

// freeWait: how long attach_disk and resize_disk wait for a disk's loop
// device to go after its last mount (the kernel frees it a moment later).
const freeWait = 10 * time.Second

// A disk made in container mode is disks/<cid>/disk.img.
const (
	diskFormatExt4 = "ext4"
	diskImage      = "disk.img"
)

// awaitFree waits (at most freeWait) until no file system holds disk
// rec's image — a VM it was taken from lets go of it a moment later, or,
// cut off, only when it ends — and says who holds it otherwise.
func (d *Driver) awaitFree(ctx context.Context, rec *diskRecord) error {
	if rec.Format != diskFormatExt4 {
		return nil
	}
	wait := freeWait
	if rec.HeldBy != "" && d.vmExists(rec.HeldBy) {
		wait = 0 // a VM cut off lets go of it when it ends, not in a moment
	}
	err := storage.AwaitFree(ctx, filepath.Join(d.path(disks, rec.CID), diskImage), wait)
	if err == nil && rec.HeldBy != "" {
		rec.HeldBy = ""
		return d.save(disks, rec.CID, rec)
	}
	return heldError(rec, err)
}

// heldError says why disk rec cannot be used yet, when err is that its
// image is still in use.
func heldError(rec *diskRecord, err error) error {
	if !errors.Is(err, storage.ErrInUse) {
		return err
	}
	if rec.HeldBy != "" {
		return fmt.Errorf("disk %s is still held by vm %s, which kept it past its detach_disk (cut off: it can neither read nor write it) and has not let go of it; delete vm %s to free it: %w", rec.CID, rec.HeldBy, rec.HeldBy, err)
	}
	return fmt.Errorf("disk %s is still mounted where it was attached before (a process there keeps files open on it): %w", rec.CID, err)
}

// diskProps: the local driver takes no disk cloud properties.
type diskProps struct{}

func checkDiskProps(p driver.Props) error {
	var v diskProps
	return p.Decode("cloud_properties", &v)
}

// update grows a disk and, when props is given, records new properties.
func (d *Driver) update(ctx context.Context, cid string, size int, props *driver.Props) (string, error) {
	rec, unlock, err := lockAndLoad[diskRecord](ctx, d, disks, cid)
	if err != nil {
		return "", err
	}
	defer unlock()
	if size < rec.SizeMiB {
		return "", fmt.Errorf("%w: shrinking disk %s from %d to %d MiB", driver.ErrNotSupported, cid, rec.SizeMiB, size)
	}
	if size > rec.SizeMiB {
		if err := d.checkSpace(size - rec.SizeMiB); err != nil {
			return "", err
		}
		if rec.Format == diskFormatExt4 {
			// The CPI API resizes detached disks; growing a mounted ext4
			// needs CAP_SYS_RESOURCE besides.
			if rec.AttachedTo != "" && d.vmExists(rec.AttachedTo) {
				return "", fmt.Errorf("disk %s is attached to vm %s: detach it first", cid, rec.AttachedTo)
			}
			if err := d.awaitFree(ctx, rec); err != nil {
				return "", fmt.Errorf("disk %s cannot grow: %w", cid, err)
			}
			if err := storage.GrowImage(ctx, filepath.Join(d.path(disks, cid), diskImage), size); err != nil {
				return "", fmt.Errorf("growing disk %s: %w", cid, err)
			}
		}
	}
	rec.SizeMiB = size
	if props != nil {
		rec.CloudProps = *props
	}
	return cid, d.save(disks, rec.CID, rec)
}

// SetDiskMetadata implements driver.Driver.
func (d *Driver) SetDiskMetadata(ctx context.Context, cid string, md map[string]string) error {
	return setMetadata(ctx, d, disks, cid, md, func(r *diskRecord) *map[string]string { return &r.Metadata })
}
