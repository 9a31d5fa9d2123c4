package openstack

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/snapshots"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"

	"github.com/runway-cpi/runway/src/driver"
)

// CreateDisk makes a Cinder volume (type and zone from cloud properties,
// else the VM's zone) and waits until it is available.
func (d *Driver) CreateDisk(ctx context.Context, spec driver.DiskSpec) (string, error) {
	var p volumeProps
	if err := spec.Decode(&p); err != nil {
		return "", err
	}
	az := p.AvailabilityZone
	if az == "" && spec.VMCID != "" && !d.cfg.IgnoreServerAvailabilityZone {
		id, err := validCID("vm", spec.VMCID)
		if err != nil {
			return "", err
		}
		s, err := d.server(ctx, id)
		if err != nil {
			return "", err
		}
		az = s.AvailabilityZone
	}
	md := metadata(spec.Tags)
	token := uuid.NewString()
	md[mdToken] = token
	opts := volumes.CreateOpts{Size: mibToGiB(spec.SizeMiB), Name: "disk-" + token, AvailabilityZone: az,
		VolumeType: firstNonEmpty(p.Type, d.cfg.DefaultVolumeType), Metadata: md}
	var v *volumes.Volume
	sent, err := d.doCreate(ctx, "volume", "create volume", func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		var err error
		v, err = volumes.Create(ctx, sc, opts, nil).Extract()
		return err
	}, func(ctx context.Context, sc *gophercloud.ServiceClient) (bool, error) {
		list, err := all(ctx, volumes.List(sc, volumes.ListOpts{Metadata: map[string]string{mdToken: token}}), volumes.ExtractVolumes)
		if err != nil || len(list) == 0 {
			return false, err
		}
		v = &list[0]
		return true, nil
	})
	if err != nil {
		if sent > 1 {
			d.sweepVolumes(ctx, token, "")
		}
		return "", d.cloudErr("create volume", err)
	}
	if sent > 1 {
		d.sweepVolumes(ctx, token, v.ID)
	}
	if err := d.waitVolume(ctx, v.ID, "available", nil); err != nil {
		d.sweepVolumes(context.WithoutCancel(ctx), token, "")
		return "", err
	}
	d.Log.Info("volume created", "volume", v.ID, "gib", opts.Size, "zone", az)
	return v.ID, nil
}

// sweepVolumes deletes volumes carrying token, except keep.
func (d *Driver) sweepVolumes(ctx context.Context, token, keep string) {
	sweep(ctx, d, "volume", "list volumes of token "+token, "volume", token, keep,
		func(ctx context.Context, sc *gophercloud.ServiceClient) ([]volumes.Volume, error) {
			return all(ctx, volumes.List(sc, volumes.ListOpts{Metadata: map[string]string{mdToken: token}}), volumes.ExtractVolumes)
		}, func(v volumes.Volume) (string, map[string]string) { return v.ID, v.Metadata }, d.deleteVolume, driver.ErrDiskNotFound)
}

// volume reads one volume; gone (404, deleting) is ErrDiskNotFound.
func (d *Driver) volume(ctx context.Context, id string) (*volumes.Volume, error) {
	v, err := read(ctx, d, "volume", "get volume "+id, fmt.Errorf("volume %s: %w", id, driver.ErrDiskNotFound),
		func(ctx context.Context, sc *gophercloud.ServiceClient) (*volumes.Volume, error) {
			return volumes.Get(ctx, sc, id).Extract()
		})
	if err != nil {
		return nil, err
	}
	if v.Status == "deleting" {
		return v, fmt.Errorf("volume %s is being deleted: %w", id, driver.ErrDiskNotFound)
	}
	return v, nil
}

// waitVolume polls until the volume has status want (and done, if given,
// agrees); error states end the wait.
func (d *Driver) waitVolume(ctx context.Context, id, want string, done func(*volumes.Volume) bool) error {
	return d.waitFor(ctx, "volume "+id+" "+want, func(ctx context.Context) (bool, error) {
		v, err := d.volume(ctx, id)
		if err != nil {
			return false, err
		}
		if strings.HasPrefix(v.Status, "error") {
			return false, fmt.Errorf("openstack: volume %s went to %s", id, v.Status)
		}
		return v.Status == want && (done == nil || done(v)), nil
	})
}

// DeleteDisk deletes a volume once it is free, and waits until it is gone.
func (d *Driver) DeleteDisk(ctx context.Context, cid string) error {
	return byID(ctx, "disk", cid, d.deleteVolume)
}

func (d *Driver) deleteVolume(ctx context.Context, id string) error {
	v, err := d.volume(ctx, id)
	if err != nil {
		return err
	}
	if busy, err := d.volumeBusy(ctx, v); err != nil {
		return err
	} else if busy {
		// Wait out a transition: creating, extending, or Nova releasing it
		// from a server that was just deleted.
		if err := d.waitFor(ctx, "volume "+id+" to be free", func(ctx context.Context) (bool, error) {
			v, err := d.volume(ctx, id)
			if err != nil {
				return false, err
			}
			busy, err := d.volumeBusy(ctx, v)
			return !busy, err
		}); err != nil {
			return err
		}
	}
	// A resent delete meets the volume deleting (400) or gone (404).
	err = d.doOnce(ctx, "volume", "delete volume "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		return volumes.Delete(ctx, sc, id, volumes.DeleteOpts{}).ExtractErr()
	}, func(err error) bool {
		if isNotFound(err) {
			return true
		}
		_, verr := d.volume(ctx, id)
		return status(err) == 400 && errors.Is(verr, driver.ErrDiskNotFound)
	})
	if isNotFound(err) {
		return fmt.Errorf("volume %s: %w", id, driver.ErrDiskNotFound)
	}
	if err != nil {
		return d.cloudErr("delete volume "+id, err)
	}
	return d.waitGone(ctx, "volume "+id, driver.ErrDiskNotFound, func(ctx context.Context) error {
		_, err := d.volume(ctx, id)
		return err
	})
}

// volumeBusy: the volume is in a transition that ends by itself. A volume
// in use by a live server is an error: the Director detaches first.
func (d *Driver) volumeBusy(ctx context.Context, v *volumes.Volume) (bool, error) {
	switch v.Status {
	case "creating", "detaching", "extending", "retyping", "attaching", "reserved", "downloading":
		return true, nil
	case "in-use":
		for _, a := range v.Attachments {
			if _, err := d.server(ctx, a.ServerID); !errors.Is(err, driver.ErrVMNotFound) {
				if err != nil {
					return false, err
				}
				return false, fmt.Errorf("openstack: volume %s is attached to server %s; detach it first", v.ID, a.ServerID)
			}
		}
		return true, nil // attached only to servers that are gone
	}
	return false, nil
}

// HasDisk: a volume being deleted counts as gone.
func (d *Driver) HasDisk(ctx context.Context, cid string) (bool, error) {
	return exists(ctx, "disk", cid, driver.ErrDiskNotFound, d.volume)
}

// ResizeDisk grows a volume (Cinder cannot shrink) and waits for it.
func (d *Driver) ResizeDisk(ctx context.Context, cid string, sizeMiB int) error {
	id, err := validCID("disk", cid)
	if err != nil {
		return err
	}
	if sizeMiB <= 0 {
		return driver.Invalid("new disk size %d MiB must be positive", sizeMiB)
	}
	v, err := d.volume(ctx, id)
	if err != nil {
		return err
	}
	return d.grow(ctx, v, mibToGiB(sizeMiB))
}

func (d *Driver) grow(ctx context.Context, v *volumes.Volume, gib int) error {
	switch {
	case gib < v.Size:
		return fmt.Errorf("%w: volume %s is %d GiB; Cinder cannot shrink it to %d GiB", driver.ErrNotSupported, v.ID, v.Size, gib)
	case gib == v.Size:
		return nil
	}
	_, err := d.do(ctx, "volume", "extend volume "+v.ID, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		return volumes.ExtendSize(ctx, sc, v.ID, volumes.ExtendSizeOpts{NewSize: gib}).ExtractErr()
	})
	if err != nil {
		// A resent extend finds the volume extending (or extended) already.
		if cur, verr := d.volume(ctx, v.ID); verr == nil && (cur.Status == "extending" || cur.Size >= gib) {
			err = nil
		}
	}
	if err != nil {
		if status(err) == 400 {
			return fmt.Errorf("%w: %w", driver.ErrNotSupported, d.cloudErr("extend volume "+v.ID, err))
		}
		return d.cloudErr("extend volume "+v.ID, err)
	}
	want := v.Status
	if want != "in-use" {
		want = "available"
	}
	return d.waitVolume(ctx, v.ID, want, func(v *volumes.Volume) bool { return v.Size >= gib })
}

// UpdateDisk grows and retypes a volume in place; a zone change, or a
// retype Cinder refuses, is NotSupported (the Director then copies).
func (d *Driver) UpdateDisk(ctx context.Context, cid string, sizeMiB int, props driver.Props) (string, error) {
	id, err := validCID("disk", cid)
	if err != nil {
		return "", err
	}
	var p volumeProps
	if err := props.Decode("cloud_properties", &p); err != nil {
		return "", err
	}
	v, err := d.volume(ctx, id)
	if err != nil {
		return "", err
	}
	if p.AvailabilityZone != "" && p.AvailabilityZone != v.AvailabilityZone {
		return "", fmt.Errorf("%w: volume %s is in zone %s; Cinder cannot move it to %s", driver.ErrNotSupported, id, v.AvailabilityZone, p.AvailabilityZone)
	}
	if sizeMiB > 0 {
		if err := d.grow(ctx, v, mibToGiB(sizeMiB)); err != nil {
			return "", err
		}
	}
	if p.Type != "" && p.Type != v.VolumeType {
		_, err := d.do(ctx, "volume", "retype volume "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
			return volumes.ChangeType(ctx, sc, id, volumes.ChangeTypeOpts{NewType: p.Type, MigrationPolicy: volumes.MigrationPolicyOnDemand}).ExtractErr()
		})
		if err != nil {
			// A resent retype finds the volume retyping (or retyped) already.
			if cur, verr := d.volume(ctx, id); verr == nil && (cur.Status == "retyping" || cur.VolumeType == p.Type) {
				err = nil
			}
		}
		if err != nil {
			if s := status(err); s == 400 || s == 404 {
				return "", fmt.Errorf("%w: %w", driver.ErrNotSupported, d.cloudErr("retype volume "+id+" to "+p.Type, err))
			}
			return "", d.cloudErr("retype volume "+id+" to "+p.Type, err)
		}
		want := "available"
		if len(v.Attachments) > 0 {
			want = "in-use"
		}
		if err := d.waitVolume(ctx, id, want, func(v *volumes.Volume) bool { return v.VolumeType == p.Type }); err != nil {
			return "", err
		}
	}
	return id, nil
}

// SetDiskMetadata merges md into the volume's metadata.
func (d *Driver) SetDiskMetadata(ctx context.Context, cid string, md map[string]string) error {
	id, err := validCID("disk", cid)
	if err != nil {
		return err
	}
	clean := metadata(md)
	delete(clean, mdToken)
	_, err = d.do(ctx, "volume", "update metadata of volume "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		_, err := sc.Post(ctx, sc.ServiceURL("volumes", id, "metadata"), map[string]any{"metadata": clean}, nil,
			&gophercloud.RequestOpts{OkCodes: []int{200}})
		return err
	})
	if isNotFound(err) {
		return fmt.Errorf("volume %s: %w", id, driver.ErrDiskNotFound)
	}
	if err != nil {
		return d.cloudErr("update metadata of volume "+id, err)
	}
	return nil
}

// Snapshots: Cinder snapshots of the volumes above.

// SnapshotDisk snapshots a volume (attached or not) with the volume's
// creator metadata plus md, and waits until the snapshot is available.
func (d *Driver) SnapshotDisk(ctx context.Context, cid string, md map[string]string) (string, error) {
	id, err := validCID("disk", cid)
	if err != nil {
		return "", err
	}
	v, err := d.volume(ctx, id)
	if err != nil {
		return "", err
	}
	meta := map[string]string{}
	for k, val := range v.Metadata {
		if k != mdToken {
			meta[k] = val
		}
	}
	for k, val := range metadata(md) {
		meta[k] = val
	}
	token := uuid.NewString()
	meta[mdToken] = token
	opts := snapshots.CreateOpts{VolumeID: id, Force: true, Name: "snapshot-" + token, Metadata: meta}
	var s *snapshots.Snapshot
	sent, err := d.doCreate(ctx, "volume", "snapshot volume "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		var err error
		s, err = snapshots.Create(ctx, sc, opts).Extract()
		return err
	}, func(ctx context.Context, sc *gophercloud.ServiceClient) (bool, error) {
		list, err := all(ctx, snapshots.List(sc, snapshots.ListOpts{VolumeID: id}), snapshots.ExtractSnapshots)
		for i := range list {
			if list[i].Metadata[mdToken] == token {
				s = &list[i]
				return true, nil
			}
		}
		return false, err
	})
	if err != nil {
		if sent > 1 {
			d.sweepSnapshots(ctx, token, "")
		}
		return "", d.cloudErr("snapshot volume "+id, err)
	}
	if sent > 1 {
		d.sweepSnapshots(ctx, token, s.ID)
	}
	err = d.waitFor(ctx, "snapshot "+s.ID+" available", func(ctx context.Context) (bool, error) {
		cur, err := d.snapshot(ctx, s.ID)
		if err != nil {
			return false, err
		}
		if strings.HasPrefix(cur.Status, "error") {
			return false, fmt.Errorf("openstack: snapshot %s of volume %s went to %s", s.ID, id, cur.Status)
		}
		return cur.Status == "available", nil
	})
	if err != nil {
		d.sweepSnapshots(context.WithoutCancel(ctx), token, "")
		return "", err
	}
	return s.ID, nil
}

func (d *Driver) snapshot(ctx context.Context, id string) (*snapshots.Snapshot, error) {
	return read(ctx, d, "volume", "get snapshot "+id, fmt.Errorf("snapshot %s: %w", id, errSnapshotGone),
		func(ctx context.Context, sc *gophercloud.ServiceClient) (*snapshots.Snapshot, error) {
			return snapshots.Get(ctx, sc, id).Extract()
		})
}

var errSnapshotGone = errors.New("snapshot not found")

func (d *Driver) sweepSnapshots(ctx context.Context, token, keep string) {
	sweep(ctx, d, "volume", "list snapshots of token "+token, "snapshot", token, keep,
		func(ctx context.Context, sc *gophercloud.ServiceClient) ([]snapshots.Snapshot, error) {
			return all(ctx, snapshots.List(sc, snapshots.ListOpts{}), snapshots.ExtractSnapshots)
		}, func(s snapshots.Snapshot) (string, map[string]string) { return s.ID, s.Metadata }, d.deleteSnapshot, nil)
}

// DeleteSnapshot deletes a snapshot and waits until it is gone; one that
// is already gone is not an error.
func (d *Driver) DeleteSnapshot(ctx context.Context, cid string) error {
	return byID(ctx, "snapshot", cid, d.deleteSnapshot)
}

func (d *Driver) deleteSnapshot(ctx context.Context, id string) error {
	// A resent delete meets the snapshot deleting (400) or gone (404).
	err := d.doOnce(ctx, "volume", "delete snapshot "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		return snapshots.Delete(ctx, sc, id).ExtractErr()
	}, func(err error) bool {
		if status(err) != 400 {
			return false
		}
		s, serr := d.snapshot(ctx, id)
		return errors.Is(serr, errSnapshotGone) || serr == nil && s.Status == "deleting"
	})
	if isNotFound(err) {
		return nil
	}
	if err != nil {
		return d.cloudErr("delete snapshot "+id, err)
	}
	return d.waitGone(ctx, "snapshot "+id, errSnapshotGone, func(ctx context.Context) error {
		_, err := d.snapshot(ctx, id)
		return err
	})
}
