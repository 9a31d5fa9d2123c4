package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

type snapshotArgs struct {
	Snapshot string `arg:"snapshot_cid"`
}

var _ = method("snapshot_disk", "disk", func(s *Service, ctx context.Context, req *rpc.Request, a *diskMetadataArgs) (any, error) {
	sn, err := optional[driver.Snapshotter](s, req)
	if err != nil {
		return nil, err
	}
	s.log().Info("snapshotting disk", "disk", a.Disk)
	return sn.SnapshotDisk(ctx, a.Disk, stringify(a.Metadata))
})

var _ = method("delete_snapshot", "snapshot", func(s *Service, ctx context.Context, req *rpc.Request, a *snapshotArgs) (any, error) {
	sn, err := optional[driver.Snapshotter](s, req)
	if err != nil {
		return nil, err
	}
	s.log().Info("deleting snapshot", "snapshot", a.Snapshot)
	return nil, sn.DeleteSnapshot(ctx, a.Snapshot)
})
