package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/runway-cpi/runway/src/clip"
	"github.com/runway-cpi/runway/src/cpiclient"
	"github.com/runway-cpi/runway/src/rpc"
)

// call runs one CPI method, with metrics.
func (g *group) call(ctx context.Context, method string, args ...any) (*cpiclient.Response, error) {
	if err := g.dep.fenced(); err != nil {
		return nil, err
	}
	start := time.Now()
	resp, err := g.cpi.Call(ctx, method, "runway-"+g.cfg().Name+"-"+randHex(4), args...)
	g.dep.metrics.cpiDuration.WithLabelValues(method).Observe(time.Since(start).Seconds())
	if err != nil {
		kind := "transport"
		var ce *rpc.Error
		if errors.As(err, &ce) {
			kind = ce.Type
		}
		g.dep.metrics.cpiErrors.WithLabelValues(method, kind).Inc()
		if kind != rpc.TypeVMNotFound {
			g.dep.failure(g.cfg().Name, "cpi "+method, err)
		}
	}
	return resp, err
}

// findVMs returns this group's VMs made for agentID. A CPI
// without list_vms (any non-Runway CPI) answers NotImplemented: nothing can
// be found then, and that is logged.
func (g *group) findVMs(ctx context.Context, agentID string) ([]listedVM, error) {
	vms, err := g.listVMs(ctx)
	if err != nil {
		return nil, err
	}
	if vms == nil {
		g.dep.log.Warn("the CPI cannot list VMs: a VM whose create_vm was interrupted cannot be found", "group", g.cfg().Name)
	}
	var out []listedVM
	for _, v := range vms {
		if v.AgentID == agentID {
			out = append(out, v)
		}
	}
	return out, nil
}

type listedVM struct {
	CID     string            `json:"cid"`
	AgentID string            `json:"agent_id"`
	State   string            `json:"state"`
	Tags    map[string]string `json:"tags"`
}

func (g *group) hasVM(ctx context.Context, cid string) (bool, error) {
	resp, err := g.call(ctx, "has_vm", cid)
	if err != nil {
		return false, fmt.Errorf("has_vm %s: %w", cid, err)
	}
	var exists bool
	if err := json.Unmarshal(resp.Result, &exists); err != nil {
		return false, fmt.Errorf("has_vm answered %s", clip.Quote(string(resp.Result), 120))
	}
	return exists, nil
}

// listVMs lists this orchestrator's VMs of the group (nil when the CPI
// has no list_vms).
func (g *group) listVMs(ctx context.Context) ([]listedVM, error) {
	resp, err := g.call(ctx, "list_vms", map[string]string{"director": g.dep.cpi.DirectorUUID, "runway_group": g.cfg().Name})
	var ce *rpc.Error
	if errors.As(err, &ce) && ce.Type == rpc.TypeNotImplemented {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list_vms: %w", err)
	}
	var vms []listedVM
	if err := json.Unmarshal(resp.Result, &vms); err != nil {
		return nil, fmt.Errorf("list_vms answer: %v", err)
	}
	return vms, nil
}
