package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/rpc"
)

type configureNetworksArgs struct {
	VM       string         `arg:"vm_cid"`
	Networks map[string]any `arg:"networks"`
}

// configure_networks (API v1, deprecated): NotSupported makes the Director
// recreate the VM.
var _ = method("configure_networks", "vm", func(*Service, context.Context, *rpc.Request, *configureNetworksArgs) (any, error) {
	return nil, NotSupported("configure_networks is not supported: recreate the VM to change its networks")
})
