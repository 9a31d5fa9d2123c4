package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/rpc"
)

var _ = method("delete_disk", "disk", func(s *Service, ctx context.Context, _ *rpc.Request, a *diskArgs) (any, error) {
	s.log().Info("deleting disk", "disk", a.Disk)
	return nil, s.Driver.DeleteDisk(ctx, a.Disk)
})
