package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/rpc"
)

var _ = method("delete_vm", "vm", func(s *Service, ctx context.Context, _ *rpc.Request, a *vmArgs) (any, error) {
	s.log().Info("deleting vm", "vm", a.VM)
	return nil, s.Driver.DeleteVM(ctx, a.VM)
})
