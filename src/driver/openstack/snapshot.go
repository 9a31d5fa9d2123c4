package openstack

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/snapshots"
)

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
	id, err := validCID("snapshot", cid)
	if err != nil {
		return err
	}
	return d.deleteSnapshot(ctx, id)
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
