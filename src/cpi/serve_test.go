package cpi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/cpi"
	_ "github.com/runway-cpi/runway/src/driver/local"
	"github.com/runway-cpi/runway/src/rpc"
	"github.com/runway-cpi/runway/src/testkit/realinputs"
)

type env struct {
	t      *testing.T
	cfg    *config.Config
	stderr bytes.Buffer
}

func newEnv(t testing.TB, extra string) *env {
	dir := t.(interface{ TempDir() string }).TempDir()
	doc := `{"driver": "local", "state_dir": "` + dir + `/state", "log_level": "debug"` + extra + `}`
	c, err := config.Parse([]byte(doc), "test.json")
	if err != nil {
		t.Fatal(err)
	}
	e := &env{cfg: c}
	if tt, ok := t.(*testing.T); ok {
		e.t = tt
	}
	// Stop whatever the test left running before its state dir goes away.
	t.Cleanup(func() {
		vms, _ := os.ReadDir(filepath.Join(dir, "state", "vms"))
		for _, vm := range vms {
			if !strings.HasPrefix(vm.Name(), ".") {
				e.call("delete_vm", 2, 0, vm.Name())
			}
		}
	})
	return e
}

type response = rpc.Reply

func (e *env) raw(in string) (string, response) {
	var out bytes.Buffer
	if err := cpi.Serve(context.Background(), strings.NewReader(in), &out, cpi.Options{Config: e.cfg, Stderr: &e.stderr}); err != nil {
		e.t.Fatal(err)
	}
	r, err := rpc.ParseReply(out.Bytes())
	if err != nil {
		e.t.Fatal(err)
	}
	return out.String(), *r
}

func (e *env) call(method string, api int, stemcellAPI int, args ...any) response {
	ctx := map[string]any{"director_uuid": "dir-1", "request_id": "cpi-777"}
	if stemcellAPI > 0 {
		ctx["vm"] = map[string]any{"stemcell": map[string]any{"api_version": stemcellAPI}}
	}
	req, err := rpc.NewRequest(method, api, ctx, args...)
	if err != nil {
		e.t.Fatal(err)
	}
	b, _ := json.Marshal(req)
	_, r := e.raw(string(b))
	return r
}

func (e *env) ok(method string, api int, args ...any) json.RawMessage {
	e.t.Helper()
	r := e.call(method, api, 2, args...)
	if r.Error != nil {
		e.t.Fatalf("%s: %s: %s", method, r.Error.Type, r.Error.Message)
	}
	return r.Result
}

func (e *env) fails(wantType string, method string, api int, args ...any) response {
	e.t.Helper()
	r := e.call(method, api, 2, args...)
	if r.Error == nil || r.Error.Type != wantType {
		e.t.Fatalf("%s: got %+v; want %s", method, r.Error, wantType)
	}
	return r
}

func str(t *testing.T, raw json.RawMessage) string {
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("result %s is not a string", raw)
	}
	return s
}

func TestInfoPerAPIVersion(t *testing.T) {
	e := newEnv(t, "")
	e.t = t
	// bosh-cli calls info with api_version 1 and reads the CPI's version
	// from the answer: every caller gets the highest supported version.
	for _, api := range []int{0, 1, 2, 3} {
		if got := string(e.ok("info", api)); got != `{"api_version":3,"stemcell_formats":["runway-local","warden-tar","general-tar"]}` {
			t.Errorf("info with api_version %d (0 = absent) = %s", api, got)
		}
	}
	e.fails("Bosh::Clouds::CpiError", "info", 2, "extra")
}

func TestV1AndV2Answers(t *testing.T) {
	e := newEnv(t, `, "agent": {"mbus": "nats://nats:4222", "ntp": ["0.pool.ntp.org"], "blobstore": {"provider": "dav"}}`)
	e.t = t
	sc := str(t, e.ok("create_stemcell", 2, realinputs.StemcellImage(t, []byte("ok")), map[string]any{}, map[string]any{"tags": map[string]any{"team": "a"}}))

	nets := map[string]any{"default": map[string]any{"type": "dynamic", "default": []string{"dns", "gateway"}}}
	v1 := str(t, e.ok("create_vm", 1, "agent-v1", sc, map[string]any{}, nets, []string{}, nil))
	var v2 []json.RawMessage
	if err := json.Unmarshal(e.ok("create_vm", 2, "agent-v2", sc, map[string]any{}, nets, []string{}, map[string]any{"bosh": map[string]any{"group": "g"}}), &v2); err != nil || len(v2) != 2 {
		t.Fatalf("create_vm v2 result %s", v2)
	}
	vm2 := str(t, v2[0])
	var answered map[string]map[string]any
	json.Unmarshal(v2[1], &answered)
	if ip, _ := answered["default"]["ip"].(string); !strings.HasPrefix(ip, "127.") {
		t.Errorf("v2 networks without a loopback address: %s", v2[1])
	}

	var settings map[string]any
	b, err := os.ReadFile(filepath.Join(e.cfg.StateDir, "vms", vm2, "agent-settings.json"))
	if err != nil {
		t.Fatal(err)
	}
	json.Unmarshal(b, &settings)
	if settings["agent_id"] != "agent-v2" || settings["mbus"] != "nats://nats:4222" ||
		settings["vm"].(map[string]any)["name"] != vm2 || settings["blobstore"].(map[string]any)["provider"] != "dav" ||
		settings["env"].(map[string]any)["bosh"].(map[string]any)["group"] != "g" || settings["networks"].(map[string]any)["default"] == nil {
		t.Errorf("agent settings %s", b)
	}

	disk := str(t, e.ok("create_disk", 2, 1024, map[string]any{}, vm2))
	if got := e.ok("attach_disk", 1, v1, disk); string(got) != "null" {
		t.Errorf("attach_disk v1 = %s; want null", got)
	}
	e.ok("detach_disk", 2, v1, disk)
	var hint map[string]string
	json.Unmarshal(e.ok("attach_disk", 2, vm2, disk), &hint)
	if !strings.HasSuffix(hint["path"], "/disks/"+disk) {
		t.Errorf("attach_disk v2 hint = %v", hint)
	}
	if got := string(e.ok("get_disks", 2, vm2)); got != `["`+disk+`"]` {
		t.Errorf("get_disks = %s", got)
	}
	if got := string(e.ok("get_disks", 2, v1)); got != `[]` {
		t.Errorf("get_disks of a vm without disks = %s; want []", got)
	}
	e.ok("set_vm_metadata", 2, vm2, map[string]any{"deployment": "d", "index": 0, "name": "web/0"})
	var rec map[string]any
	b, _ = os.ReadFile(filepath.Join(e.cfg.StateDir, "vms", vm2, "vm.json"))
	json.Unmarshal(b, &rec)
	if md := rec["metadata"].(map[string]any); md["index"] != "0" || md["name"] != "web/0" {
		t.Errorf("metadata %v", md)
	}
	if tags := rec["tags"].(map[string]any); tags["director"] != "dir-1" || tags["agent_id"] != "agent-v2" {
		t.Errorf("creator tags %v", tags)
	}
}

func TestErrorTypesWhereTheDirectorExpectsThem(t *testing.T) {
	e := newEnv(t, "")
	e.t = t
	unknownVM, unknownDisk := "vm-00000000-0000-0000-0000-000000000000", "disk-00000000-0000-0000-0000-000000000000"
	e.fails("Bosh::Clouds::VMNotFound", "delete_vm", 2, unknownVM)
	e.fails("Bosh::Clouds::VMNotFound", "reboot_vm", 2, unknownVM)
	e.fails("Bosh::Clouds::DiskNotFound", "delete_disk", 2, unknownDisk)
	e.fails("Bosh::Clouds::NotImplemented", "current_vm_id", 2)
	e.fails("Bosh::Clouds::NotSupported", "configure_networks", 2, unknownVM, map[string]any{})
	r := e.fails("Bosh::Clouds::NotImplemented", "snapshot_everything", 2)
	if r.Error.Message != "Must call implemented method: snapshot_everything" {
		t.Errorf("message %q", r.Error.Message)
	}
	r = e.fails("Bosh::Clouds::NoDiskSpace", "create_disk", 2, 1<<50, map[string]any{}, nil)
	if !r.Error.OkToRetry {
		t.Error("NoDiskSpace without ok_to_retry")
	}
	e.fails("Bosh::Clouds::CloudError", "create_vm", 2, "a", "sc-missing", map[string]any{}, map[string]any{}, []string{}, nil)
	e.fails("Bosh::Clouds::CpiError", "has_vm", 2, "../../etc")
	e.fails("Bosh::Clouds::CpiError", "create_disk", 2, "1024", map[string]any{}, nil)
	e.fails("Bosh::Clouds::CpiError", "create_vm", 2, "a")

	sc := str(t, e.ok("create_stemcell", 2, realinputs.StemcellImage(t, []byte("ok")), map[string]any{}))
	vm := str(t, e.ok("create_vm", 1, "a", sc, map[string]any{}, map[string]any{}, nil, nil))
	disk := str(t, e.ok("create_disk", 2, 10, nil, nil))
	e.fails("Bosh::Clouds::DiskNotAttached", "detach_disk", 2, vm, disk)
	e.fails("Bosh::Clouds::NotSupported", "resize_disk", 2, disk, 5)
	e.fails("Bosh::Clouds::NotSupported", "update_disk", 2, disk, 5, map[string]any{})
	if got := str(t, e.ok("update_disk", 2, disk, 20, map[string]any{})); got != disk {
		t.Errorf("update_disk = %s", got)
	}
	// Nothing is silently ignored: the local driver has no disk properties.
	r = e.fails("Bosh::Clouds::CpiError", "update_disk", 2, disk, 30, map[string]any{"type": "fast"})
	if !strings.Contains(r.Error.Message, `unknown key "type"`) {
		t.Errorf("message %q", r.Error.Message)
	}
	r = e.fails("Bosh::Clouds::VMCreationFailed", "create_vm", 2, "a", sc, map[string]any{"command": []any{"/nonexistent/binary"}}, map[string]any{}, nil, nil)
	if r.Error.OkToRetry {
		t.Error("a missing command is not worth retrying")
	}
}

// Credentials in the request context (cpi-config properties) stay secret
// even when the context is refused: the local driver knows none of them.
func TestContextSecretsNeverReachTheAnswer(t *testing.T) {
	e := newEnv(t, "")
	e.t = t
	canary := "canary-ctx-s3cret-0452"
	for _, key := range []string{"api_key", "password", "secret_access_key", "application_credential_secret", "session_token"} {
		req := map[string]any{"method": "has_vm", "api_version": 2, "arguments": []any{"vm-1"},
			"context": map[string]any{"director_uuid": "d", key: canary}}
		b, _ := json.Marshal(req)
		out, r := e.raw(string(b))
		if r.Error == nil || !strings.Contains(r.Error.Message, fmt.Sprintf("unknown key %q", key)) {
			t.Errorf("%s: %+v; want an unknown-key error naming it", key, r.Error)
		}
		if strings.Contains(out, canary) || strings.Contains(e.stderr.String(), canary) {
			t.Fatalf("%s leaked:\nstdout: %s\nstderr: %s", key, out, e.stderr.String())
		}
	}
}

func TestSecretsNeverReachTheLog(t *testing.T) {
	e := newEnv(t, `, "local": {"stop_grace_seconds": 1}`)
	e.t = t
	sc := str(t, e.ok("create_stemcell", 2, realinputs.StemcellImage(t, []byte("ok")), map[string]any{}))
	canary := "canary-s3cret-0451"
	req := map[string]any{
		"method": "create_vm", "api_version": 2,
		"arguments": []any{"agent", sc, map[string]any{"user_data": "#!/bin/sh\necho " + canary}, map[string]any{}, []string{},
			map[string]any{"bosh": map[string]any{"password": canary}, "runner": map[string]any{"registration_token": canary}}},
		"context": map[string]any{"director_uuid": "d", "request_id": "cpi-1"},
	}
	b, _ := json.Marshal(req)
	out, r := e.raw(string(b))
	if r.Error != nil {
		t.Fatal(r.Error.Message)
	}
	if strings.Contains(out, canary) || strings.Contains(e.stderr.String(), canary) {
		t.Fatalf("secret leaked:\nstdout: %s\nstderr: %s", out, e.stderr.String())
	}
	if !strings.Contains(r.Log, "<redacted>") {
		t.Errorf("debug trace does not show the redacted request: %s", r.Log)
	}
}

func TestRequestIDOnEveryLine(t *testing.T) {
	e := newEnv(t, "")
	e.t = t
	r := e.call("has_vm", 2, 2, "vm-1")
	for _, line := range strings.Split(strings.TrimSpace(r.Log), "\n") {
		if !strings.Contains(line, "[cpi-777]") {
			t.Errorf("line without request id: %q", line)
		}
	}
}

func TestBadConfigIsACpiError(t *testing.T) {
	var out bytes.Buffer
	_, cfgErr := config.Load("/nonexistent/cpi.json")
	cpi.Serve(context.Background(), strings.NewReader(`{"method":"has_vm","arguments":["vm-1"],"context":{"director_uuid":"d"}}`), &out,
		cpi.Options{ConfigErr: cfgErr, Stderr: &bytes.Buffer{}})
	if !strings.Contains(out.String(), `"type":"Bosh::Clouds::CpiError"`) || !strings.Contains(out.String(), "/nonexistent/cpi.json") {
		t.Fatalf("got %s", out.String())
	}
	e := newEnv(t, `, "local": {"stop_grace": 1}`)
	e.t = t
	r := e.call("has_vm", 2, 0, "vm-1")
	if r.Error == nil || r.Error.Type != "Bosh::Clouds::CpiError" || !strings.Contains(r.Error.Message, `unknown key "stop_grace" (did you mean "stop_grace_seconds"?)`) {
		t.Fatalf("bad driver section: %+v", r.Error)
	}
}

// A request context carries cpi-config properties; on the local driver
// every key configures the host (a VM's isolation, the runtime, the shell
// that runs commands as root), so none may come from a context, in either
// of the forms the Director and callers use.
func TestContextCannotReconfigureTheHost(t *testing.T) {
	e := newEnv(t, "")
	e.t = t
	if r := e.call("has_vm", 2, 0, "vm-1"); r.Error != nil {
		t.Fatal(r.Error.Message)
	}
	for _, ctx := range []map[string]any{
		{"director_uuid": "d", "local": map[string]any{"shell": "/tmp/x"}},
		{"director_uuid": "d", "request_id": "cpi-2", "isolation": "process"},
		{"director_uuid": "d", "container": map[string]any{"runtime": "/tmp/x"}},
		// The agent profile's allow switch (issue 37): never from a context.
		{"director_uuid": "d", "container": map[string]any{"bosh_agent": true}},
		{"director_uuid": "d", "local": map[string]any{"container": map[string]any{"bosh_agent": true}}},
		{"director_uuid": "d", "loopback_cidr": "127.1.0.0/16"},
	} {
		b, _ := json.Marshal(map[string]any{"method": "has_vm", "arguments": []any{"vm-1"}, "context": ctx})
		_, r := e.raw(string(b))
		if r.Error == nil || r.Error.Type != "Bosh::Clouds::CpiError" || !strings.Contains(r.Error.Message, "configures the host and cannot come from a request context") {
			t.Errorf("%v: %+v", ctx, r.Error)
		}
	}
}

// FuzzServe feeds arbitrary bytes through decoding and dispatch. Whatever
// comes in, exactly one well-formed response must come out.
func FuzzServe(f *testing.F) {
	for _, seed := range []string{
		`{"method":"info","arguments":[],"context":{"director_uuid":"d"}}`,
		`{"method":"has_vm","arguments":["vm-1"],"context":{"director_uuid":"d"},"api_version":2}`,
		`{"method":"create_disk","arguments":[1,{},null],"context":{"director_uuid":"d"}}`,
		`{"method":"delete_disk","arguments":["../x"],"context":{"director_uuid":"d"}}`,
		`{"method":"set_vm_metadata","arguments":["vm-1",{"a":1}],"context":{"director_uuid":"d"}}`,
		`{"method":"create_vm","arguments":["a","sc",{},{"n":{"type":"dynamic"}},[],{}],"context":{"director_uuid":"d"},"api_version":2}`,
		`{"method":"calculate_vm_cloud_properties","arguments":[{"cpu":1,"ram":512,"ephemeral_disk_size":1024}],"context":{"director_uuid":"d"}}`,
		`{"method":`, ``, `[]`, `null`,
	} {
		f.Add([]byte(seed))
	}
	dir := f.TempDir()
	c, err := config.Parse([]byte(`{"driver":"local","state_dir":"`+dir+`","lock_timeout_seconds":1,"local":{"run_processes":false}}`), "")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		if err := cpi.Serve(context.Background(), bytes.NewReader(in), &out, cpi.Options{Config: c, Stderr: &bytes.Buffer{}}); err != nil {
			t.Fatal(err)
		}
		var r map[string]json.RawMessage
		dec := json.NewDecoder(&out)
		if err := dec.Decode(&r); err != nil {
			t.Fatalf("not JSON: %q", out.String())
		}
		if dec.More() {
			t.Fatal("more than one document")
		}
		var log string
		if err := json.Unmarshal(r["log"], &log); err != nil {
			t.Fatalf("log is not a string: %s", r["log"])
		}
		if string(r["error"]) != "null" {
			var e struct {
				Type      string `json:"type"`
				OkToRetry *bool  `json:"ok_to_retry"`
			}
			if json.Unmarshal(r["error"], &e) != nil || !strings.HasPrefix(e.Type, "Bosh::Clouds::") || e.OkToRetry == nil {
				t.Fatalf("bad error object %s", r["error"])
			}
			if string(r["result"]) != "null" {
				t.Fatalf("result %s alongside an error", r["result"])
			}
		}
	})
}
