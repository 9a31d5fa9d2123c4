package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/rpc"
)

var _ = method("reboot_vm", "vm", func(s *Service, ctx context.Context, _ *rpc.Request, a *vmArgs) (any, error) {
	s.log().Info("rebooting vm", "vm", a.VM)
	return nil, s.Driver.RebootVM(ctx, a.VM)
})
