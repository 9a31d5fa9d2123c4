package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

type snapshotArgs struct {
	Snapshot string `arg:"snapshot_cid"`
}

var _ = method("delete_snapshot", "snapshot", func(s *Service, ctx context.Context, req *rpc.Request, a *snapshotArgs) (any, error) {
	sn, ok := s.Driver.(driver.Snapshotter)
	if !ok {
		return nil, s.lacks(req.Method)
	}
	s.log().Info("deleting snapshot", "snapshot", a.Snapshot)
	return nil, sn.DeleteSnapshot(ctx, a.Snapshot)
})
