package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

type resizeDiskArgs struct {
	Disk    string `arg:"disk_cid"`
	NewSize int    `arg:"new_size"` // MiB
}

// resize_disk: NotImplemented or NotSupported make the Director copy the
// disk instead.
var _ = method("resize_disk", "disk", func(s *Service, ctx context.Context, req *rpc.Request, a *resizeDiskArgs) (any, error) {
	if a.NewSize <= 0 {
		return nil, CpiError("resize_disk: argument 2 (new_size) must be a positive number of MiB, got %d", a.NewSize)
	}
	r, ok := s.Driver.(driver.DiskResizer)
	if !ok {
		return nil, s.lacks(req.Method)
	}
	s.Logger.Info("cpi", "resizing disk %s to %d MiB", a.Disk, a.NewSize)
	return nil, r.ResizeDisk(ctx, a.Disk, a.NewSize)
})
