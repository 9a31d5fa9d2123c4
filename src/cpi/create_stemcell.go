package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

type createStemcellArgs struct {
	ImagePath  string       `arg:"image_path"`
	CloudProps driver.Props `arg:"cloud_properties"`
	// API v3: {"tags": {...}}.
	Env *struct {
		Tags map[string]string `json:"tags"`
	} `arg:"env,optional,nullable"`
}

var _ = method("create_stemcell", "stemcell", func(s *Service, ctx context.Context, req *rpc.Request, a *createStemcellArgs) (any, error) {
	tags := s.creatorTags(req)
	if a.Env != nil {
		for k, v := range a.Env.Tags {
			tags[k] = v
		}
	}
	s.log().Info("creating stemcell", "image_path", a.ImagePath)
	cid, err := s.Driver.CreateStemcell(ctx, driver.StemcellSpec{ImagePath: a.ImagePath, CloudProps: a.CloudProps, Tags: tags})
	if err != nil {
		return nil, err
	}
	s.log().Info("created stemcell", "stemcell", cid)
	return cid, nil
})
