package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

// start_vm is Runway's own (garm's StartInstance): never sent by the
// Director.
var _ = method("start_vm", "vm", func(s *Service, ctx context.Context, req *rpc.Request, a *vmArgs) (any, error) {
	p, ok := s.Driver.(driver.PowerSwitch)
	if !ok {
		return nil, s.lacks(req.Method)
	}
	s.log().Info("starting vm", "vm", a.VM)
	return nil, p.StartVM(ctx, a.VM)
})
