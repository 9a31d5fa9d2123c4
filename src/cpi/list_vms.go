package cpi

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
)

type listVMsArgs struct {
	Tags     map[string]string `arg:"tags,optional,nullable"`
	Metadata map[string]string `arg:"metadata,optional,nullable"`
}

// list_vms is Runway's own, never sent by the Director: for hooks, reapers,
// garm and the orchestrator. It answers the VMs carrying every given tag
// and metadata value.
var _ = method("list_vms", "vm", func(s *Service, ctx context.Context, req *rpc.Request, a *listVMsArgs) (any, error) {
	l, ok := s.Driver.(driver.VMLister)
	if !ok {
		return nil, s.lacks(req.Method)
	}
	vms, err := l.ListVMs(ctx, a.Tags)
	if err != nil {
		return nil, err
	}
	out := []map[string]any{}
	for _, vm := range vms {
		ok := true
		for k, v := range a.Metadata {
			ok = ok && vm.Metadata[k] == v
		}
		if ok {
			out = append(out, map[string]any{"cid": vm.CID, "agent_id": vm.AgentID, "state": vm.State,
				"tags": vm.Tags, "metadata": vm.Metadata, "networks": vm.Networks})
		}
	}
	return out, nil
})
