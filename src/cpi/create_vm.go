package cpi

import (
	"context"
	"encoding/json"

	"github.com/google/uuid"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

type createVMArgs struct {
	AgentID     string          `arg:"agent_id"`
	StemcellCID string          `arg:"stemcell_cid"`
	CloudProps  driver.Props    `arg:"cloud_properties"`
	Networks    driver.Networks `arg:"networks"`
	DiskCIDs    []string        `arg:"disk_cids,nullable"`
	// The VM environment may hold secrets: hooks see only bosh.group(s).
	Env map[string]any `arg:"environment,nullable"`
}

var _ = method("create_vm", "vm", func(s *Service, ctx context.Context, req *rpc.Request, a *createVMArgs) (any, error) {
	if a.AgentID == "" {
		return nil, CpiError("create_vm: argument 1 (agent_id) must not be empty")
	}
	spec := driver.VMSpec{AgentID: a.AgentID, StemcellCID: a.StemcellCID, CloudProps: a.CloudProps,
		Networks: a.Networks, DiskCIDs: a.DiskCIDs, Env: a.Env}
	if spec.Networks == nil {
		spec.Networks = driver.Networks{}
	}
	id, err := uuid.NewRandom()
	if err != nil {
		return nil, VMCreationFailed(true, "generating vm name: %v", err)
	}
	spec.Name = "vm-" + id.String()
	spec.Tags = s.creatorTags(req)
	spec.Tags["agent_id"] = spec.AgentID
	if bosh, ok := spec.Env["bosh"].(map[string]any); ok {
		if tags, ok := bosh["tags"].(map[string]any); ok {
			for k, v := range tags {
				if sv, ok := v.(string); ok {
					spec.Tags[k] = sv
				}
			}
		}
	}
	if req.StemcellAPIVersion() >= 2 {
		settings := newAgentSettings(s.Config.Agent, spec.AgentID, spec.Name, spec.Networks, spec.Env)
		b, err := json.Marshal(settings)
		if err != nil {
			return nil, CpiError("encoding agent settings: %v", err)
		}
		spec.AgentSettings = b
	}
	s.log().Info("creating vm", "vm", spec.Name, "agent", spec.AgentID, "stemcell", spec.StemcellCID)
	vm, err := s.Driver.CreateVM(ctx, spec)
	if err != nil {
		return nil, err
	}
	s.log().Info("created vm", "vm", vm.CID)
	if req.APIVersion >= 2 {
		return []any{vm.CID, vm.Networks}, nil
	}
	return vm.CID, nil
})
