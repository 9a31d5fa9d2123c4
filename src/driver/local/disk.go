package local

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// CreateDisk implements driver.Driver.
func (d *Driver) CreateDisk(ctx context.Context, spec driver.DiskSpec) (string, error) {
	if spec.VMCID != "" {
		if err := store.CheckCID("vm", spec.VMCID); err != nil {
			return "", err
		}
	}
	if err := checkDiskProps(spec.CloudProps); err != nil {
		return "", err
	}
	if err := d.st.CheckSpace(spec.SizeMiB); err != nil {
		return "", err
	}
	cid, unlock, err := d.st.LockNew(ctx, store.Disks, "disk-")
	if err != nil {
		return "", err
	}
	defer unlock()
	rec := store.Disk{CID: cid, SizeMiB: spec.SizeMiB, CloudProps: spec.CloudProps, Tags: spec.Tags,
		Metadata: map[string]string{}, NearVM: spec.VMCID, CreatedAt: store.Now()}
	tmp, err := d.st.Stage(store.Disks, cid)
	if err != nil {
		return "", err
	}
	if err := d.iso.MakeDisk(ctx, &rec, tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return "", err
	}
	if err := d.st.Publish(store.Disks, cid, tmp, rec); err != nil {
		return "", err
	}
	return cid, nil
}

// DeleteDisk implements driver.Driver.
func (d *Driver) DeleteDisk(ctx context.Context, cid string) error {
	rec, unlock, err := store.LockAndLoad[store.Disk](ctx, d.st, store.Disks, cid)
	if err != nil {
		return err
	}
	defer unlock()
	// A VM that is gone holds nothing (a call killed half-way can leave
	// its record naming one): only a live VM's attachment stops a delete.
	if rec.AttachedTo != "" && d.st.VMExists(rec.AttachedTo) {
		return fmt.Errorf("disk %s is attached to vm %s: detach it first", cid, rec.AttachedTo)
	}
	if err := d.diskIso(rec).AwaitFree(ctx, rec); err != nil {
		return err
	}
	defer d.st.Sweep(store.Disks)
	return d.st.Remove(store.Disks, cid)
}

// HasDisk implements driver.Driver.
func (d *Driver) HasDisk(_ context.Context, cid string) (bool, error) {
	return d.st.Has(store.Disks, cid)
}

// lockPair takes the VM lock, then the disk lock: always in that order, so
// two processes never deadlock.
func (d *Driver) lockPair(ctx context.Context, vm, disk string) (func(), error) {
	if err := store.CheckCID("vm", vm); err != nil {
		return nil, err
	}
	if err := store.CheckCID("disk", disk); err != nil {
		return nil, err
	}
	uv, err := d.st.Lock(ctx, store.VMs, vm)
	if err != nil {
		return nil, err
	}
	ud, err := d.st.Lock(ctx, store.Disks, disk)
	if err != nil {
		uv()
		return nil, err
	}
	return func() { ud(); uv() }, nil
}

// AttachDisk implements driver.Driver; the hint is the path where the disk
// appears inside the VM's directory.
func (d *Driver) AttachDisk(ctx context.Context, vm, disk string) (any, error) {
	unlock, err := d.lockPair(ctx, vm, disk)
	if err != nil {
		return nil, err
	}
	defer unlock()
	vmRec, err := d.st.LoadVM(vm)
	if err != nil {
		return nil, err
	}
	rec, err := d.st.LoadDisk(disk)
	if err != nil {
		return nil, err
	}
	if rec.AttachedTo != "" && rec.AttachedTo != vm {
		return nil, fmt.Errorf("disk %s is already attached to vm %s", disk, rec.AttachedTo)
	}
	iso := d.isoOf(vmRec)
	if err := iso.Takes(vmRec, rec); err != nil {
		return nil, err
	}
	link := d.st.DiskLink(vm, disk)
	before := rec.AttachedTo
	rec.AttachedTo = vm
	if err := d.st.Save(store.Disks, rec.CID, rec); err != nil {
		return nil, err
	}
	target := filepath.Join(d.st.Dir(store.Disks, disk), "data")
	if cur, err := os.Readlink(link); err != nil || cur != target {
		_ = os.Remove(link)
		if err := os.Symlink(target, link); err != nil {
			return nil, fmt.Errorf("linking disk %s into vm %s: %w", disk, vm, err)
		}
	}
	where, err := iso.Attach(ctx, vmRec, disk)
	if err != nil && before == "" {
		// Refused (the disk still held elsewhere) or failed: nothing of it
		// stays in the VM, and the record says so.
		if _, derr := iso.Detach(ctx, vmRec, disk); derr != nil {
			return nil, errors.Join(err, derr)
		}
		rec.AttachedTo = ""
		_ = os.Remove(link)
		return nil, errors.Join(err, d.st.Save(store.Disks, rec.CID, rec))
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
	rec, err := d.st.LoadDisk(disk)
	if err != nil {
		return err
	}
	vmRec, err := d.st.LoadVM(vm)
	if errors.Is(err, driver.ErrVMNotFound) && rec.AttachedTo == vm && !d.st.VMExists(vm) {
		// The VM went without clearing the record (a call killed
		// half-way): detaching from it is only forgetting it.
		rec.AttachedTo = ""
		return d.st.Save(store.Disks, rec.CID, rec)
	}
	if err != nil {
		return err
	}
	if rec.AttachedTo == vm {
		// Out of the VM first: the record says attached until it is.
		cut, err := d.isoOf(vmRec).Detach(ctx, vmRec, disk)
		if err != nil {
			return err
		}
		if cut {
			rec.HeldBy = vm
			d.st.Log.Warn("the vm still held the disk after every mount of it was taken away (an open file, a working directory or a mount it hid): its file system was flushed and shut down there, so the vm can neither read nor write it, and the disk keeps its data as of now; attach_disk, resize_disk, snapshot_disk and delete_disk wait for the vm to let go of it (delete the vm)",
				"vm", vm, "disk", disk)
		}
	}
	if rec.AttachedTo != vm {
		return fmt.Errorf("%w: disk %s is not attached to vm %s", driver.ErrDiskNotAttached, disk, vm)
	}
	rec.AttachedTo = ""
	if err := d.st.Save(store.Disks, rec.CID, rec); err != nil {
		return err
	}
	if err := os.Remove(d.st.DiskLink(vm, disk)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// clearAttachment detaches a disk from a VM being deleted (VM lock held).
func (d *Driver) clearAttachment(ctx context.Context, vm, disk string) error {
	if store.CheckCID("disk", disk) != nil {
		return os.Remove(d.st.DiskLink(vm, disk))
	}
	unlock, err := d.st.Lock(ctx, store.Disks, disk)
	if err != nil {
		return err
	}
	defer unlock()
	rec, err := d.st.LoadDisk(disk)
	if err == nil && rec.AttachedTo == vm {
		rec.AttachedTo = ""
		if err := d.st.Save(store.Disks, rec.CID, rec); err != nil {
			return err
		}
	}
	return nil
}

// GetDisks implements driver.Driver: the disks whose records name the VM
// (the records, not the VM's links, are the truth).
func (d *Driver) GetDisks(_ context.Context, vm string) ([]string, error) {
	if _, err := d.st.LoadVM(vm); err != nil {
		return nil, err
	}
	return d.st.DisksAttachedTo(vm)
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

// diskProps: the local driver takes no disk cloud properties.
type diskProps struct{}

func checkDiskProps(p driver.Props) error {
	var v diskProps
	return p.Decode("cloud_properties", &v)
}

// update grows a disk and, when props is given, records new properties.
func (d *Driver) update(ctx context.Context, cid string, size int, props *driver.Props) (string, error) {
	rec, unlock, err := store.LockAndLoad[store.Disk](ctx, d.st, store.Disks, cid)
	if err != nil {
		return "", err
	}
	defer unlock()
	if size < rec.SizeMiB {
		return "", fmt.Errorf("%w: shrinking disk %s from %d to %d MiB", driver.ErrNotSupported, cid, rec.SizeMiB, size)
	}
	if size > rec.SizeMiB {
		if err := d.st.CheckSpace(size - rec.SizeMiB); err != nil {
			return "", err
		}
		if err := d.diskIso(rec).GrowDisk(ctx, rec, size); err != nil {
			return "", err
		}
	}
	rec.SizeMiB = size
	if props != nil {
		rec.CloudProps = *props
	}
	return cid, d.st.Save(store.Disks, rec.CID, rec)
}

// SetDiskMetadata implements driver.Driver.
func (d *Driver) SetDiskMetadata(ctx context.Context, cid string, md map[string]string) error {
	return store.SetMetadata(ctx, d.st, store.Disks, cid, md, func(r *store.Disk) *map[string]string { return &r.Metadata })
}
