package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/rpc"
)

// info answers the highest API version to every caller: bosh-cli asks
// with api_version 1 and takes a missing key for a v1 CPI.
var _ = method("info", "none", func(s *Service, _ context.Context, _ *rpc.Request, _ *noArgs) (any, error) {
	return map[string]any{"api_version": APIVersion, "stemcell_formats": s.Driver.StemcellFormats()}, nil
})
