package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

// stop_vm is Runway's own (garm's StopInstance): never sent by the
// Director.
var _ = method("stop_vm", "vm", func(s *Service, ctx context.Context, req *rpc.Request, a *vmArgs) (any, error) {
	p, ok := s.Driver.(driver.PowerSwitch)
	if !ok {
		return nil, s.lacks(req.Method)
	}
	s.log().Info("stopping vm", "vm", a.VM)
	return nil, p.StopVM(ctx, a.VM)
})
