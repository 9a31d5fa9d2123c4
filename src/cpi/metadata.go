package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

type vmMetadataArgs struct {
	VM       string         `arg:"vm_cid"`
	Metadata map[string]any `arg:"metadata"`
}

type diskMetadataArgs struct {
	Disk     string         `arg:"disk_cid"`
	Metadata map[string]any `arg:"metadata"`
}

var _ = method("set_vm_metadata", "vm", func(s *Service, ctx context.Context, _ *rpc.Request, a *vmMetadataArgs) (any, error) {
	return nil, s.Driver.SetVMMetadata(ctx, a.VM, stringify(a.Metadata))
})

var _ = method("set_disk_metadata", "disk", func(s *Service, ctx context.Context, req *rpc.Request, a *diskMetadataArgs) (any, error) {
	m, err := optional[driver.DiskMetadata](s, req)
	if err != nil {
		return nil, err
	}
	return nil, m.SetDiskMetadata(ctx, a.Disk, stringify(a.Metadata))
})
