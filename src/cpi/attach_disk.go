package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/rpc"
)

type vmDiskArgs struct {
	VM   string `arg:"vm_cid"`
	Disk string `arg:"disk_cid"`
}

// attach_disk answers the disk hint at API v2 (the Director fails on an
// empty one), nothing at v1.
var _ = method("attach_disk", "disk", func(s *Service, ctx context.Context, req *rpc.Request, a *vmDiskArgs) (any, error) {
	s.log().Info("attaching disk", "disk", a.Disk, "vm", a.VM)
	hint, err := s.Driver.AttachDisk(ctx, a.VM, a.Disk)
	if err != nil {
		return nil, err
	}
	if req.APIVersion >= 2 {
		if hint == nil || hint == "" {
			return nil, CloudError("attach_disk: driver returned no disk hint for %s", a.Disk)
		}
		return hint, nil
	}
	return nil, nil
})
