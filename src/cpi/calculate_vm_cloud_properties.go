package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

type resourcesArgs struct {
	Size driver.Resources `arg:"desired_instance_size"`
}

var _ = method("calculate_vm_cloud_properties", "vm", func(s *Service, ctx context.Context, req *rpc.Request, a *resourcesArgs) (any, error) {
	if a.Size.CPU < 0 || a.Size.RAM < 0 || a.Size.EphemeralDiskSize < 0 {
		return nil, CpiError("calculate_vm_cloud_properties: cpu, ram and ephemeral_disk_size must not be negative")
	}
	z, err := optional[driver.VMSizer](s, req)
	if err != nil {
		return nil, err
	}
	return z.CalculateVMCloudProperties(ctx, a.Size)
})
