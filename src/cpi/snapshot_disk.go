package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

var _ = method("snapshot_disk", "disk", func(s *Service, ctx context.Context, req *rpc.Request, a *diskMetadataArgs) (any, error) {
	sn, ok := s.Driver.(driver.Snapshotter)
	if !ok {
		return nil, s.lacks(req.Method)
	}
	s.log().Info("snapshotting disk", "disk", a.Disk)
	return sn.SnapshotDisk(ctx, a.Disk, stringify(a.Metadata))
})
