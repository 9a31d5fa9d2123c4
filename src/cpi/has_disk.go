package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/rpc"
)

var _ = method("has_disk", "disk", func(s *Service, ctx context.Context, _ *rpc.Request, a *diskArgs) (any, error) {
	return s.Driver.HasDisk(ctx, a.Disk)
})
