package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/rpc"
)

// info answers the highest API version to every caller (rpc.APIVersion).
var _ = method("info", "none", func(s *Service, _ context.Context, _ *rpc.Request, _ *noArgs) (any, error) {
	return rpc.Info{APIVersion: rpc.APIVersion, StemcellFormats: s.Driver.StemcellFormats()}, nil
})
