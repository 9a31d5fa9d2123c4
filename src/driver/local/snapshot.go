package local

import (
	"context"
	"fmt"
	"os"

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
	snap, unlockSnap, err := d.st.LockNew(ctx, store.Snapshots, "snap-")
	if err != nil {
		return "", err
	}
	defer unlockSnap()
	iso := d.diskIso(rec)
	size, err := iso.DiskSize(rec)
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
	if err := iso.CopyDisk(ctx, rec, tmp, budget); err != nil {
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
