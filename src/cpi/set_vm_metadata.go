package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/rpc"
)

type vmMetadataArgs struct {
	VM       string         `arg:"vm_cid"`
	Metadata map[string]any `arg:"metadata"`
}

var _ = method("set_vm_metadata", "vm", func(s *Service, ctx context.Context, _ *rpc.Request, a *vmMetadataArgs) (any, error) {
	return nil, s.Driver.SetVMMetadata(ctx, a.VM, stringify(a.Metadata))
})
