package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/rpc"
)

type stemcellArgs struct {
	Stemcell string `arg:"stemcell_cid"`
}

var _ = method("delete_stemcell", "stemcell", func(s *Service, ctx context.Context, _ *rpc.Request, a *stemcellArgs) (any, error) {
	return nil, s.Driver.DeleteStemcell(ctx, a.Stemcell)
})
