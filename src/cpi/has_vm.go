package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/rpc"
)

var _ = method("has_vm", "vm", func(s *Service, ctx context.Context, _ *rpc.Request, a *vmArgs) (any, error) {
	return s.Driver.HasVM(ctx, a.VM)
})
