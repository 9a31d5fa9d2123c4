package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

type updateDiskArgs struct {
	Disk       string       `arg:"disk_cid"`
	NewSize    int          `arg:"new_size"` // MiB
	CloudProps driver.Props `arg:"cloud_properties"`
}

var _ = method("update_disk", "disk", func(s *Service, ctx context.Context, req *rpc.Request, a *updateDiskArgs) (any, error) {
	r, err := s.resizer(req, a.NewSize)
	if err != nil {
		return nil, err
	}
	s.log().Info("updating disk", "disk", a.Disk, "size_mib", a.NewSize)
	return r.UpdateDisk(ctx, a.Disk, a.NewSize, a.CloudProps)
})
