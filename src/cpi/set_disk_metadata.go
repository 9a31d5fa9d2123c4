package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

type diskMetadataArgs struct {
	Disk     string         `arg:"disk_cid"`
	Metadata map[string]any `arg:"metadata"`
}

var _ = method("set_disk_metadata", "disk", func(s *Service, ctx context.Context, req *rpc.Request, a *diskMetadataArgs) (any, error) {
	m, ok := s.Driver.(driver.DiskMetadata)
	if !ok {
		return nil, s.lacks(req.Method)
	}
	return nil, m.SetDiskMetadata(ctx, a.Disk, stringify(a.Metadata))
})
