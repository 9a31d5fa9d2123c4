package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/rpc"
)

var _ = method("get_disks", "vm", func(s *Service, ctx context.Context, _ *rpc.Request, a *vmArgs) (any, error) {
	disks, err := s.Driver.GetDisks(ctx, a.VM)
	if disks == nil && err == nil {
		disks = []string{}
	}
	return disks, err
})
