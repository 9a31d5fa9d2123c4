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
	r, err := s.resizer(req, a.NewSize)
	if err != nil {
		return nil, err
	}
	s.log().Info("resizing disk", "disk", a.Disk, "size_mib", a.NewSize)
	return nil, r.ResizeDisk(ctx, a.Disk, a.NewSize)
})

// resizer is the driver's DiskResizer for resize_disk and update_disk,
// once new_size (argument 2) is a positive number of MiB.
func (s *Service) resizer(req *rpc.Request, newSize int) (driver.DiskResizer, error) {
	if newSize <= 0 {
		return nil, CpiError("%s: argument 2 (new_size) must be a positive number of MiB, got %d", req.Method, newSize)
	}
	return optional[driver.DiskResizer](s, req)
}
