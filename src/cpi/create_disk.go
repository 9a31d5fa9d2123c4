package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

type createDiskArgs struct {
	Size       int          `arg:"disk_size"` // MiB
	CloudProps driver.Props `arg:"cloud_properties"`
	VM         *string      `arg:"vm_cid,optional,nullable"` // place the disk near it
}

var _ = method("create_disk", "disk", func(s *Service, ctx context.Context, req *rpc.Request, a *createDiskArgs) (any, error) {
	if a.Size <= 0 {
		return nil, CpiError("create_disk: argument 1 (disk_size) must be a positive number of MiB, got %d", a.Size)
	}
	spec := driver.DiskSpec{SizeMiB: a.Size, CloudProps: a.CloudProps, Tags: s.creatorTags(req)}
	if a.VM != nil {
		spec.VMCID = *a.VM
	}
	s.log().Info("creating disk", "size_mib", spec.SizeMiB)
	cid, err := s.Driver.CreateDisk(ctx, spec)
	if err != nil {
		return nil, err
	}
	s.log().Info("created disk", "disk", cid)
	return cid, nil
})
