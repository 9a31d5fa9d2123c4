package ctrvm

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// A container VM's disk is an ext4 image of the disk's size,
// disks/<cid>/disk.img, every block allocated when it is made: a device
// of its own in the VM, which stops at its size.

// image is disk rec's image.
func (v *VMs) image(rec *store.Disk) string {
	return filepath.Join(v.st.Dir(store.Disks, rec.CID), store.DiskImage)
}

// MakeDisk makes an ext4 image of the disk's size, all of it allocated now.
func (v *VMs) MakeDisk(ctx context.Context, rec *store.Disk, dir string) error {
	rec.Format = store.DiskFormatExt4
	return storage.MakeImage(ctx, filepath.Join(dir, store.DiskImage), rec.SizeMiB, storage.DiskImage, false)
}

// AwaitFree: see awaitFree.
func (v *VMs) AwaitFree(ctx context.Context, rec *store.Disk) error {
	return v.awaitFree(ctx, rec)
}

// GrowDisk grows a detached disk's file system: the CPI API resizes
// detached disks; growing a mounted ext4 needs CAP_SYS_RESOURCE besides.
func (v *VMs) GrowDisk(ctx context.Context, rec *store.Disk, sizeMiB int) error {
	if rec.AttachedTo != "" && v.st.VMExists(rec.AttachedTo) {
		return fmt.Errorf("disk %s is attached to vm %s: detach it first", rec.CID, rec.AttachedTo)
	}
	if err := v.awaitFree(ctx, rec); err != nil {
		return fmt.Errorf("disk %s cannot grow: %w", rec.CID, err)
	}
	if err := storage.GrowImage(ctx, v.image(rec), sizeMiB); err != nil {
		return fmt.Errorf("growing disk %s: %w", rec.CID, err)
	}
	return nil
}

// DiskSize: what the image has allocated.
func (v *VMs) DiskSize(rec *store.Disk) (int64, error) {
	return storage.Allocated(v.image(rec))
}

// CopyDisk copies the image whole — frozen while a VM has it mounted
// (every mount and open file of it is one file system, so every holder
// waits), and otherwise only once nothing holds it.
func (v *VMs) CopyDisk(ctx context.Context, rec *store.Disk, tmp string, _ *storage.Budget) error {
	copyImage := func() error { return storage.CopyImage(v.image(rec), filepath.Join(tmp, store.DiskImage)) }
	if rec.AttachedTo != "" {
		if vm, err := v.st.LoadVM(rec.AttachedTo); err == nil {
			at, _ := v.ctr(vm.CID).diskMount(*vm, rec.CID)
			if mounted := v.vmPathOf(vm, at); mounted != "" && storage.IsMountPoint(mounted) {
				return storage.Frozen(mounted, copyImage)
			}
		}
	}
	if err := v.awaitFree(ctx, rec); err != nil {
		return fmt.Errorf("it cannot be copied consistently while it is in use and not attached where the driver can freeze it: %w", err)
	}
	return copyImage()
}

// freeWait: how long attach_disk and resize_disk wait for a disk's loop
// device to go after its last mount (the kernel frees it a moment later).
const freeWait = 10 * time.Second

// awaitFree waits (at most freeWait) until no file system holds disk
// rec's image — a VM it was taken from lets go of it a moment later, or,
// cut off, only when it ends — and says who holds it otherwise.
func (v *VMs) awaitFree(ctx context.Context, rec *store.Disk) error {
	if rec.Format != store.DiskFormatExt4 {
		return nil
	}
	wait := freeWait
	if rec.HeldBy != "" && v.st.VMExists(rec.HeldBy) {
		wait = 0 // a VM cut off lets go of it when it ends, not in a moment
	}
	err := storage.AwaitFree(ctx, filepath.Join(v.st.Dir(store.Disks, rec.CID), store.DiskImage), wait)
	if err == nil && rec.HeldBy != "" {
		rec.HeldBy = ""
		return v.st.Save(store.Disks, rec.CID, rec)
	}
	return heldError(rec, err)
}

// heldError says why disk rec cannot be used yet, when err is that its
// image is still in use.
func heldError(rec *store.Disk, err error) error {
	if !errors.Is(err, storage.ErrInUse) {
		return err
	}
	if rec.HeldBy != "" {
		return fmt.Errorf("disk %s is still held by vm %s, which kept it past its detach_disk (cut off: it can neither read nor write it) and has not let go of it; delete vm %s to free it: %w", rec.CID, rec.HeldBy, rec.HeldBy, err)
	}
	return fmt.Errorf("disk %s is still mounted where it was attached before (a process there keeps files open on it): %w", rec.CID, err)
}
