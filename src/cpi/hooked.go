package cpi

import (
	"context"
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/hooks"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/retry"
	"github.com/runway-cpi/runway/src/rpc"
)

// hookCall describes req to hooks with every secret removed: the VM
// environment is dropped whole, secret-looking keys are redacted, and only
// whitelisted context keys are passed.
func hookCall(m *Method, req *rpc.Request) *hooks.Call {
	c := &hooks.Call{Method: req.Method, RequestID: req.RequestID(), DirectorUUID: req.DirectorUUID(),
		ObjectType: m.Object, Scalars: map[string]string{}, Args: []any{},
		Context: map[string]any{"director_uuid": req.DirectorUUID()}}
	if id := req.RequestID(); id != "" {
		c.Context["request_id"] = id
	}
	if v := req.StemcellAPIVersion(); v > 0 {
		c.Context["vm"] = map[string]any{"stemcell": map[string]any{"api_version": v}}
	}
	for i, raw := range req.Arguments {
		var v any
		_ = json.Unmarshal(raw, &v)
		name := ""
		if i < len(m.Args) {
			name = m.Args[i].Name
		}
		if name == "environment" {
			v = hookEnvironment(v)
			if bosh, ok := v.(map[string]any)["bosh"].(map[string]any); ok {
				flatten(c.Scalars, "bosh_groups", bosh["groups"])
				flatten(c.Scalars, "bosh_group", bosh["group"])
			}
		} else {
			v = logging.Redacted(v)
		}
		c.Args = append(c.Args, v)
		if name != "" {
			flatten(c.Scalars, name, v)
		}
	}
	return c
}

// HookVariables lists the CPI_<ARGUMENT> variables a method's scripts get:
// one per argument that is a string, number, boolean or list of strings
// (an object reaches scripts through CPI_REQUEST_FILE only), and the VM
// environment's placement groups.
func HookVariables(m *Method) []string {
	var out []string
	for _, a := range m.Args {
		if a.Name == "environment" {
			out = append(out, "CPI_BOSH_GROUP", "CPI_BOSH_GROUPS")
			continue
		}
		t := a.Type
		if t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		switch t.Kind() {
		case reflect.String, reflect.Int, reflect.Bool, reflect.Float64:
		case reflect.Slice:
			if t.Elem().Kind() != reflect.String {
				continue
			}
		default:
			continue
		}
		out = append(out, "CPI_"+strings.ToUpper(a.Name))
	}
	return out
}

// flatten sets scalars[name] for strings, numbers, booleans and arrays of
// strings (space-separated).
func flatten(scalars map[string]string, name string, v any) {
	switch t := v.(type) {
	case string:
		scalars[name] = t
	case float64:
		scalars[name] = strconv.FormatFloat(t, 'f', -1, 64)
	case bool:
		scalars[name] = strconv.FormatBool(t)
	case []any:
		var parts []string
		for _, x := range t {
			if s, ok := x.(string); ok {
				parts = append(parts, s)
			}
		}
		scalars[name] = strings.Join(parts, " ")
	}
}

// hookEnvironment keeps only the VM environment's placement identifiers
// (bosh.group, bosh.groups: director, deployment, instance group names);
// everything else may be a secret and is dropped.
func hookEnvironment(v any) any {
	out := map[string]any{}
	env, _ := v.(map[string]any)
	bosh, _ := env["bosh"].(map[string]any)
	keep := map[string]any{}
	for _, k := range []string{"group", "groups"} {
		if x, ok := bosh[k]; ok {
			keep[k] = logging.Redacted(x)
		}
	}
	if len(keep) > 0 {
		out["bosh"] = keep
	}
	return out
}

// Invoke runs req with hooks around it: pre (deny → CloudError; defer →
// wait within the budget or a retriable error), the method, then post.
func (s *Service) Invoke(ctx context.Context, req *rpc.Request, runner *hooks.Runner) (any, *rpc.Error) {
	m, ok := methods[req.Method]
	if runner == nil || !ok {
		return s.Call(ctx, req)
	}
	call := hookCall(m, req)
	res, werr := s.pre(ctx, req, runner, call)
	if werr == nil {
		res, werr = s.Call(ctx, req)
	}
	post := hooks.Result{Status: "success", Value: res}
	if werr != nil {
		post = hooks.Result{Status: "error", ErrorType: werr.Type, ErrorMsg: werr.Message}
	}
	runner.Post(ctx, call, post)
	return res, werr
}

func (s *Service) pre(ctx context.Context, req *rpc.Request, runner *hooks.Runner, call *hooks.Call) (any, *rpc.Error) {
	budget := runner.DeferBudget()
	var waited time.Duration
	for {
		v := runner.Pre(ctx, call)
		if v.Deny {
			return nil, CloudError("%s denied by hook %s: %s", req.Method, v.Hook, v.Message)
		}
		if v.RetryAfter == 0 {
			return nil, nil
		}
		after := time.Duration(v.RetryAfter) * time.Second
		if remaining := budget - waited; remaining > 0 {
			wait := min(after, remaining)
			logging.Fields{Logger: s.Logger, Tag: "hooks"}.Info("deferred by a hook; waiting", "method", req.Method, "hook", v.Hook,
				"retry_after_s", v.RetryAfter, "message", v.Message, "wait", wait, "defer_budget", budget)
			if err := retry.SleepContext(ctx, wait); err != nil {
				return nil, CloudError("%s: interrupted while waiting for hook %s: %v", req.Method, v.Hook, err)
			}
			waited += wait
			continue
		}
		msg := "%s deferred by hook %s, retry after %ds: %s"
		switch req.Method {
		case "create_vm":
			return nil, VMCreationFailed(true, msg, req.Method, v.Hook, v.RetryAfter, v.Message)
		case "create_disk", "resize_disk":
			return nil, NoDiskSpace(msg, req.Method, v.Hook, v.RetryAfter, v.Message)
		}
		return nil, CloudError(msg, req.Method, v.Hook, v.RetryAfter, v.Message)
	}
}
