// Package cpi is the CPI service: one descriptor per method (one file
// each, or one per kind for small ones of one kind), argument types, typed
// BOSH errors and agent settings. It drives a driver.Driver and knows no
// IaaS.
package cpi

import (
	"context"
	"encoding/json"
	"strconv"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/rpc"
)

// Service answers one request against one driver.
type Service struct {
	Config *config.Config
	Driver driver.Driver
	Logger logging.Logger
	// DriverErr, when set, is why no driver could be built (a bad
	// section or request context): every call answers it, after the pre
	// hooks, so post hooks and the audit log see the refusal too.
	DriverErr *rpc.Error
}

// Call dispatches req. The error, when not nil, is always an *rpc.Error.
func (s *Service) Call(ctx context.Context, req *rpc.Request) (any, *rpc.Error) {
	m, ok := methods[req.Method]
	if !ok {
		return nil, NotImplemented("Must call implemented method: %s", req.Method)
	}
	if s.DriverErr != nil {
		return nil, s.DriverErr
	}
	res, err := m.call(s, ctx, req)
	if err != nil {
		return nil, toWire(req.Method, err)
	}
	return res, nil
}

// log is the call's logger for what the service itself says.
func (s *Service) log() logging.Fields { return logging.Fields{Logger: s.Logger, Tag: "cpi"} }

// lacks answers a method the driver cannot do.
func (s *Service) lacks(method string) error {
	return NotImplemented("%s is not implemented by driver %s", method, s.Config.Driver)
}

// optional is the driver as T, the optional interface a method needs, or
// lacks' answer when the driver has not got it.
func optional[T any](s *Service, req *rpc.Request) (T, error) {
	c, ok := s.Driver.(T)
	if !ok {
		return c, s.lacks(req.Method)
	}
	return c, nil
}

// creatorTags identify who made a resource.
func (s *Service) creatorTags(req *rpc.Request) map[string]string {
	t := map[string]string{"created_by": "runway"}
	if d := req.DirectorUUID(); d != "" {
		t["director"] = d
	}
	return t
}

// stringify turns metadata values into strings (the Director sends strings,
// but index numbers and booleans have been seen from other callers).
func stringify(md map[string]any) map[string]string {
	out := make(map[string]string, len(md))
	for k, v := range md {
		switch t := v.(type) {
		case string:
			out[k] = t
		case nil:
			out[k] = ""
		case float64:
			out[k] = strconv.FormatFloat(t, 'f', -1, 64)
		default:
			b, _ := json.Marshal(t)
			out[k] = string(b)
		}
	}
	return out
}
