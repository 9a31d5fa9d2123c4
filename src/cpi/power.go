package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

// start_vm and stop_vm are Runway's own (garm's StartInstance and
// StopInstance): never sent by the Director.
var (
	_ = powerMethod("start_vm", "starting vm", driver.PowerSwitch.StartVM)
	_ = powerMethod("stop_vm", "stopping vm", driver.PowerSwitch.StopVM)
)

// powerMethod registers a method that turns a VM on or off with the
// driver's PowerSwitch.
func powerMethod(name, doing string, do func(driver.PowerSwitch, context.Context, string) error) *Method {
	return method(name, "vm", func(s *Service, ctx context.Context, req *rpc.Request, a *vmArgs) (any, error) {
		p, err := optional[driver.PowerSwitch](s, req)
		if err != nil {
			return nil, err
		}
		s.log().Info(doing, "vm", a.VM)
		return nil, do(p, ctx, a.VM)
	})
}
