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
	l, err := optional[driver.VMLister](s, req)
	if err != nil {
		return nil, err
	}
	vms, err := l.ListVMs(ctx, a.Tags)
	if err != nil {
		return nil, err
	}
	out := []ListedVM{}
	for _, vm := range vms {
		ok := true
		for k, v := range a.Metadata {
			ok = ok && vm.Metadata[k] == v
		}
		if ok {
			out = append(out, ListedVM{CID: vm.CID, AgentID: vm.AgentID, State: vm.State, Tags: vm.Tags,
				Metadata: vm.Metadata, Networks: vm.Networks})
		}
	}
	return out, nil
})

// ListedVM is one VM in list_vms' answer.
type ListedVM struct {
	CID      string            `json:"cid"`
	AgentID  string            `json:"agent_id"`
	State    string            `json:"state"` // running | stopped | error | unknown
	Tags     map[string]string `json:"tags"`
	Metadata map[string]string `json:"metadata"`
	Networks driver.Networks   `json:"networks"`
}
