package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/rpc"
)

// current_vm_id (API v1, deprecated): present with the answer the Director
// expects.
var _ = method("current_vm_id", "none", func(*Service, context.Context, *rpc.Request, *noArgs) (any, error) {
	return nil, NotImplemented("current_vm_id is deprecated and not implemented")
})
