package rpc

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

func TestParseRequestErrors(t *testing.T) {
	for name, tc := range map[string]struct{ in, want string }{
		"empty":            {"  \n", "empty request"},
		"malformed":        {`{"method":`, "malformed request JSON"},
		"array":            {`[1,2]`, "must be a JSON object"},
		"trailing":         {`{"method":"info","arguments":[],"context":{"director_uuid":"d"}} {}`, "trailing data"},
		"no method":        {`{"arguments":[],"context":{"director_uuid":"d"}}`, "'method'"},
		"method not str":   {`{"method":5,"arguments":[],"context":{"director_uuid":"d"}}`, "'method'"},
		"no arguments":     {`{"method":"info","context":{"director_uuid":"d"}}`, "'arguments'"},
		"arguments object": {`{"method":"info","arguments":{},"context":{"director_uuid":"d"}}`, "'arguments'"},
		"no context":       {`{"method":"info","arguments":[]}`, "director_uuid"},
		"uuid not string":  {`{"method":"info","arguments":[],"context":{"director_uuid":7}}`, "director_uuid"},
		"context string":   {`{"method":"info","arguments":[],"context":"x"}`, "'context'"},
		"api_version str":  {`{"method":"info","arguments":[],"context":{"director_uuid":"d"},"api_version":"2"}`, "api_version"},
		"api_version frac": {`{"method":"info","arguments":[],"context":{"director_uuid":"d"},"api_version":2.5}`, "api_version"},
	} {
		_, err := ParseRequest([]byte(tc.in))
		if err == nil || err.Type != TypeCpiError || !strings.Contains(err.Message, tc.want) {
			t.Errorf("%s: got %v; want CpiError containing %q", name, err, tc.want)
		}
	}
}

func TestParseRequest(t *testing.T) {
	r, err := ParseRequest([]byte(`{"method":"create_vm","arguments":[1,"a"],"context":{"director_uuid":"d","request_id":"cpi-9","vm":{"stemcell":{"api_version":2}}},"api_version":2}`))
	if err != nil {
		t.Fatal(err)
	}
	if r.Method != "create_vm" || len(r.Arguments) != 2 || r.APIVersion != 2 ||
		r.DirectorUUID() != "d" || r.RequestID() != "cpi-9" || r.StemcellAPIVersion() != 2 {
		t.Fatalf("parsed %+v", r)
	}
	r, _ = ParseRequest([]byte(`{"method":"info","arguments":[],"context":{"director_uuid":"d"}}`))
	if r.APIVersion != 0 || r.StemcellAPIVersion() != 0 {
		t.Fatalf("absent versions parsed as %+v", r)
	}
}

func TestReadRequestCapsInput(t *testing.T) {
	big := `{"method":"info","arguments":["` + strings.Repeat("x", MaxRequestBytes) + `"],"context":{"director_uuid":"d"}}`
	_, err := ReadRequest(strings.NewReader(big))
	if err == nil || !strings.Contains(err.Message, "exceeds") {
		t.Fatalf("oversized request: %v", err)
	}
}

func req(t *testing.T, args string) *Request {
	t.Helper()
	r, err := ParseRequest([]byte(`{"method":"m","arguments":` + args + `,"context":{"director_uuid":"d"}}`))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestBind(t *testing.T) {
	var s string
	var n int
	var m map[string]any
	var opt *string
	params := func() []Param {
		return []Param{{Name: "cid", Into: &s}, {Name: "size", Into: &n}, {Name: "props", Into: &m}, {Name: "vm", Into: &opt, Optional: true, Nullable: true}}
	}
	if err := req(t, `["a", 3, {"k": 1}, "vm-1"]`).Bind(params()...); err != nil || s != "a" || n != 3 || m["k"] != 1.0 || *opt != "vm-1" {
		t.Fatalf("bind: %v %q %d %v", err, s, n, m)
	}
	opt, m = nil, nil
	if err := req(t, `["a", 3, null]`).Bind(params()...); err != nil || m != nil || opt != nil {
		t.Fatalf("null map and absent optional: %v", err)
	}
	for args, want := range map[string]string{
		`["a"]`:                     "m: expected 3 to 4 arguments (cid, size, props, [vm]), got 1",
		`["a", 3, {}, null, 5]`:     "m: expected 3 to 4 arguments (cid, size, props, [vm]), got 5",
		`[5, 3, {}]`:                "m: argument 1 (cid) must be a string, got a number 5",
		`["a", "3", {}]`:            "m: argument 2 (size) must be an integer, got a string",
		`["a", 3.5, {}]`:            "m: argument 2 (size) must be an integer, got a non-integer number 3.5",
		`["a", 3, []]`:              "m: argument 3 (props) must be an object, got an array",
		`[null, 3, {}]`:             "m: argument 1 (cid) must be a string, got null",
		`["a", 3, {}, 7]`:           "m: argument 4 (vm) must be a string or null, got a number 7",
		`["a", 3, {}, {"x": true}]`: "m: argument 4 (vm) must be a string or null, got an object",
	} {
		err := req(t, args).Bind(params()...)
		if err == nil || err.Type != TypeCpiError || err.Message != want {
			t.Errorf("%s: got %v; want %q", args, err, want)
		}
	}
}

func TestBindNestedFieldError(t *testing.T) {
	var nets map[string]struct {
		IP string `json:"ip"`
	}
	err := req(t, `[{"default": {"ip": 5}}]`).Bind(Param{Name: "networks", Into: &nets})
	if err == nil || !strings.Contains(err.Message, `argument 1 (networks): field "ip" must be a string`) {
		t.Fatalf("got %v", err)
	}
}

func TestWriteResponse(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteResponse(&buf, Response{Result: "x", Error: NewError(TypeCloudError, false, "boom")}); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got["result"] != nil || got["log"] != "" || got["error"].(map[string]any)["ok_to_retry"] != false {
		t.Fatalf("response %s", buf.String())
	}
	buf.Reset()
	WriteResponse(&buf, Response{Result: func() {}})
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil || got["error"].(map[string]any)["type"] != TypeCpiError {
		t.Fatalf("unencodable result: %s", buf.String())
	}
}

func TestBindArgs(t *testing.T) {
	var a struct {
		CID   string         `arg:"cid"`
		Size  int            `arg:"size"`
		Props map[string]any `arg:"props"`
		VM    *string        `arg:"vm,optional,nullable"`
	}
	if err := req(t, `["a", 3, {"k": 1}]`).BindArgs(&a); err != nil || a.CID != "a" || a.Size != 3 || a.VM != nil {
		t.Fatalf("bind: %v %+v", err, a)
	}
	if err := req(t, `["a", "3", {}]`).BindArgs(&a); err == nil || err.Message != "m: argument 2 (size) must be an integer, got a string" {
		t.Fatalf("got %v", err)
	}
	specs := ArgSpecs(reflect.TypeOf(a))
	if len(specs) != 4 || specs[3].Name != "vm" || !specs[3].Optional || !specs[3].Nullable || specs[0].Optional {
		t.Fatalf("specs %+v", specs)
	}
}
