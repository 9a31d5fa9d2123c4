package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// SnapshotDisk implements driver.Driver: a copy of the disk's data taken
// under the disk lock.
func (d *Driver) SnapshotDisk(ctx context.Context, cid string, md map[string]string) (string, error) {
	rec, unlock, err := store.LockAndLoad[store.Disk](ctx, d.st, store.Disks, cid)
	if err != nil {
		return "", err
	}
	defer unlock()
	snap, err := store.NewCID("snap-")
	if err != nil {
		return "", err
	}
	unlockSnap, err := d.st.Lock(ctx, store.Snapshots, snap)
	if err != nil {
		return "", err
	}
	defer unlockSnap()
	src := filepath.Join(d.st.Dir(store.Disks, cid), "data")
	if rec.Format == store.DiskFormatExt4 {
		src = filepath.Join(d.st.Dir(store.Disks, cid), store.DiskImage)
	}
	var size int64
	if rec.Format == store.DiskFormatExt4 {
		size, err = storage.Allocated(src)
	} else {
		size, err = storage.TreeSize(src)
	}
	if err != nil {
		return "", fmt.Errorf("reading disk %s: %w", cid, err)
	}
	budget, err := storage.NewBudget(d.st.Root, 0, 0)
	if err != nil {
		return "", err
	}
	if err := budget.Fits(size); err != nil {
		return "", fmt.Errorf("snapshot of disk %s (%d MiB of data): %w", cid, size>>20, err)
	}
	tmp, err := d.st.Stage(store.Snapshots, snap)
	if err != nil {
		return "", err
	}
	if err := d.copyDisk(ctx, rec, src, tmp, budget); err != nil {
		_ = os.RemoveAll(tmp)
		return "", fmt.Errorf("copying disk %s: %w", cid, err)
	}
	sr := store.Snapshot{CID: snap, DiskCID: cid, SizeMiB: rec.SizeMiB, Metadata: md, CreatedAt: store.Now()}
	if err := d.st.Publish(store.Snapshots, snap, tmp, sr); err != nil {
		return "", err
	}
	return snap, nil
}

// DeleteSnapshot implements driver.Driver. A snapshot already gone is not
// an error: the Director has no SnapshotNotFound to swallow.
func (d *Driver) DeleteSnapshot(ctx context.Context, cid string) error {
	return d.st.RemoveIfPresent(ctx, store.Snapshots, cid)
}

// copyDisk copies a disk's data into a snapshot's staging directory: a
// directory's files one by one, an image whole — frozen while a VM has it
// mounted (every mount and open file of it is one file system, so every
// holder waits), and otherwise only once nothing holds it.
func (d *Driver) copyDisk(ctx context.Context, rec *store.Disk, src, tmp string, budget *storage.Budget) error {
	if rec.Format != store.DiskFormatExt4 {
		return storage.CopyTree(ctx, src, filepath.Join(tmp, "data"), budget)
	}
	copyImage := func() error { return storage.CopyImage(src, filepath.Join(tmp, store.DiskImage)) }
	if rec.AttachedTo != "" {
		if vm, err := d.st.LoadVM(rec.AttachedTo); err == nil {
			at, _ := d.ctr(vm.CID).diskMount(*vm, rec.CID)
			if mounted := d.vmPathOf(vm, at); mounted != "" && storage.IsMountPoint(mounted) {
				return storage.Frozen(mounted, copyImage)
			}
		}
	}
	if err := d.awaitFree(ctx, rec); err != nil {
		return fmt.Errorf("it cannot be copied consistently while it is in use and not attached where the driver can freeze it: %w", err)
	}
	return copyImage()
}
