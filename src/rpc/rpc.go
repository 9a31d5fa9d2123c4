// Package rpc is the BOSH CPI wire format: one JSON request in, one JSON
// response out. It knows nothing of IaaS; callers supply the method table.
package rpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/runway-cpi/runway/src/clip"
)

// MaxRequestBytes caps what is read from stdin. Real requests are a few KiB;
// the cap keeps a runaway caller from exhausting memory.
const MaxRequestBytes = 4 << 20

// APIVersion is the CPI API version Runway speaks; info answers it to
// every caller (bosh-cli asks with api_version 1 and takes a missing key
// for a v1 CPI).
const APIVersion = 3

// Info is info's result.
type Info struct {
	APIVersion      int      `json:"api_version"`
	StemcellFormats []string `json:"stemcell_formats"`
}

// DirectorContextKeys are the keys the Director puts in every request's
// context for itself; every other key is a cpi-config property it merged
// in (external_cpi.rb).
var DirectorContextKeys = []string{"director_uuid", "request_id", "vm"}

// Wire error types the Director and bosh-cli know (reference/cpi-api.md).
const (
	TypeCpiError         = "Bosh::Clouds::CpiError"
	TypeCloudError       = "Bosh::Clouds::CloudError"
	TypeNotImplemented   = "Bosh::Clouds::NotImplemented"
	TypeNotSupported     = "Bosh::Clouds::NotSupported"
	TypeVMNotFound       = "Bosh::Clouds::VMNotFound"
	TypeNetworkNotFound  = "Bosh::Clouds::NetworkNotFound"
	TypeDiskNotFound     = "Bosh::Clouds::DiskNotFound"
	TypeDiskNotAttached  = "Bosh::Clouds::DiskNotAttached"
	TypeVMCreationFailed = "Bosh::Clouds::VMCreationFailed"
	TypeNoDiskSpace      = "Bosh::Clouds::NoDiskSpace"
)

// Error is the wire error object. It is also a Go error so that services can
// return it directly.
type Error struct {
	Type      string `json:"type"`
	Message   string `json:"message"`
	OkToRetry bool   `json:"ok_to_retry"`
}

func (e *Error) Error() string { return e.Type + ": " + e.Message }

// NewError builds a wire error.
func NewError(typ string, okToRetry bool, format string, args ...any) *Error {
	return &Error{Type: typ, Message: fmt.Sprintf(format, args...), OkToRetry: okToRetry}
}

// Request is one decoded CPI call.
type Request struct {
	Method    string            `json:"method"`
	Arguments []json.RawMessage `json:"arguments"`
	Context   map[string]any    `json:"context"`
	// APIVersion is 0 when absent (the Director's first info call).
	APIVersion int `json:"api_version,omitempty"`
}

// NewRequest builds a request as a caller sends it. ctx must hold
// director_uuid; args are encoded in order.
func NewRequest(method string, apiVersion int, ctx map[string]any, args ...any) (*Request, error) {
	r := &Request{Method: method, APIVersion: apiVersion, Context: ctx, Arguments: []json.RawMessage{}}
	for i, a := range args {
		b, err := json.Marshal(a)
		if err != nil {
			return nil, fmt.Errorf("%s: argument %d: %w", method, i+1, err)
		}
		r.Arguments = append(r.Arguments, b)
	}
	return r, nil
}

// DirectorUUID returns context.director_uuid.
func (r *Request) DirectorUUID() string { s, _ := r.Context["director_uuid"].(string); return s }

// RequestID returns context.request_id, or "" when absent.
func (r *Request) RequestID() string { s, _ := r.Context["request_id"].(string); return s }

// CPIConfig returns the context's cpi-config properties: every key but
// the Director's own (nil when there are none).
func (r *Request) CPIConfig() map[string]any {
	var out map[string]any
	for k, v := range r.Context {
		if !slices.Contains(DirectorContextKeys, k) {
			if out == nil {
				out = map[string]any{}
			}
			out[k] = v
		}
	}
	return out
}

// StemcellAPIVersion returns context.vm.stemcell.api_version, or 0.
func (r *Request) StemcellAPIVersion() int {
	vm, _ := r.Context["vm"].(map[string]any)
	st, _ := vm["stemcell"].(map[string]any)
	v, _ := st["api_version"].(float64)
	return int(v)
}

// ReadRequest reads and validates one request. Every failure is a CpiError
// ready to be written back.
func ReadRequest(in io.Reader) (*Request, *Error) {
	data, err := io.ReadAll(io.LimitReader(in, MaxRequestBytes+1))
	if err != nil {
		return nil, NewError(TypeCpiError, false, "reading request: %v", err)
	}
	if len(data) > MaxRequestBytes {
		return nil, NewError(TypeCpiError, false, "request exceeds %d bytes", MaxRequestBytes)
	}
	return ParseRequest(data)
}

// ParseRequest validates one request document.
func ParseRequest(data []byte) (*Request, *Error) {
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, NewError(TypeCpiError, false, "empty request: expected one JSON object on stdin")
	}
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil {
		return nil, NewError(TypeCpiError, false, "malformed request JSON: %s", jsonErr(err))
	}
	if raw == nil {
		return nil, NewError(TypeCpiError, false, "request must be a JSON object")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, NewError(TypeCpiError, false, "malformed request JSON: trailing data after the request object")
	}
	req := &Request{}
	m, ok := raw["method"]
	if !ok || json.Unmarshal(m, &req.Method) != nil || req.Method == "" {
		return nil, NewError(TypeCpiError, false, "request needs a non-empty string 'method'")
	}
	a, ok := raw["arguments"]
	if !ok || isNull(a) || json.Unmarshal(a, &req.Arguments) != nil {
		return nil, NewError(TypeCpiError, false, "%s: request needs an array 'arguments'", req.Method)
	}
	if c, ok := raw["context"]; ok && !isNull(c) {
		if err := json.Unmarshal(c, &req.Context); err != nil || req.Context == nil {
			return nil, NewError(TypeCpiError, false, "%s: 'context' must be a JSON object", req.Method)
		}
	}
	if _, ok := req.Context["director_uuid"].(string); !ok {
		return nil, NewError(TypeCpiError, false, "%s: 'context' needs a string 'director_uuid'", req.Method)
	}
	if v, ok := raw["api_version"]; ok && !isNull(v) {
		if err := json.Unmarshal(v, &req.APIVersion); err != nil || req.APIVersion < 1 {
			return nil, NewError(TypeCpiError, false, "%s: 'api_version' must be a positive integer, got %s", req.Method, clip.Quote(string(v), 200))
		}
	}
	return req, nil
}

// Response is the wire response. Log is always a string.
type Response struct {
	Result any    `json:"result"`
	Error  *Error `json:"error"`
	Log    string `json:"log"`
}

// WriteResponse encodes resp as a single JSON document followed by a newline.
// A result that cannot be encoded becomes a CpiError response rather than
// a half-written document.
func WriteResponse(out io.Writer, resp Response) error {
	if resp.Error != nil {
		resp.Result = nil
	}
	data, err := json.Marshal(resp)
	if err != nil {
		data, _ = json.Marshal(Response{Error: NewError(TypeCpiError, false, "encoding response: %v", err), Log: resp.Log})
	}
	_, err = out.Write(append(data, '\n'))
	return err
}

// Reply is a response as a caller reads it: the result left raw for the
// caller's own type.
type Reply struct {
	Result json.RawMessage `json:"result"`
	Error  *Error          `json:"error"`
	Log    string          `json:"log"`
}

// ParseReply validates one response document the way the Director does:
// one JSON object, a string log, and an error (when present) with a type,
// a message and a boolean ok_to_retry, and no result beside it.
func ParseReply(data []byte) (*Reply, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil || raw == nil {
		return nil, fmt.Errorf("not a CPI response: %q", clip.Quote(string(data), 200))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("more than one document: %q", clip.Quote(string(data), 200))
	}
	r := &Reply{Result: raw["result"]}
	if err := json.Unmarshal(raw["log"], &r.Log); err != nil || raw["log"] == nil {
		return nil, fmt.Errorf("response log missing or not a string: %q", clip.Quote(string(data), 200))
	}
	if e, ok := raw["error"]; ok && !isNull(e) {
		var we struct {
			Type      *string `json:"type"`
			Message   *string `json:"message"`
			OkToRetry *bool   `json:"ok_to_retry"`
		}
		if err := json.Unmarshal(e, &we); err != nil || we.Type == nil || we.Message == nil || we.OkToRetry == nil {
			return nil, fmt.Errorf("response error needs type, message and a boolean ok_to_retry: %s", clip.Quote(string(e), 200))
		}
		if len(r.Result) > 0 && !isNull(r.Result) {
			return nil, fmt.Errorf("response has a result beside its error: %q", clip.Quote(string(data), 200))
		}
		r.Error = &Error{Type: *we.Type, Message: *we.Message, OkToRetry: *we.OkToRetry}
	}
	return r, nil
}

func isNull(raw json.RawMessage) bool { return string(bytes.TrimSpace(raw)) == "null" }

func jsonErr(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%v (at byte %d)", se, se.Offset)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return "unexpected end of input"
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return "request must be a JSON object, got " + te.Value
	}
	return err.Error()
}
