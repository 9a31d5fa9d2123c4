package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/rpc"
)

var _ = method("detach_disk", "disk", func(s *Service, ctx context.Context, _ *rpc.Request, a *vmDiskArgs) (any, error) {
	s.log().Info("detaching disk", "disk", a.Disk, "vm", a.VM)
	return nil, s.Driver.DetachDisk(ctx, a.VM, a.Disk)
})
