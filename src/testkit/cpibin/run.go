package cpibin

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/rpc"
)

// Caller runs bin/cpi once per call, the way the Director does: one
// request on stdin, one response on stdout.
type Caller struct {
	Bin, Config string
	// Context is every request's context (director_uuid, request_id, a
	// cpi-config's properties); Extra keys per call are merged over it.
	Context map[string]any
	// Secrets must never appear in stdout or stderr.
	Secrets []string
}

// Call sends method with args (API v2) and the context plus extra; it
// fails the test when bin/cpi does not answer one JSON response or a
// secret shows.
func (c Caller) Call(t testing.TB, extra map[string]any, method string, args ...any) rpc.Reply {
	t.Helper()
	ctx := map[string]any{"director_uuid": "cpibin-director", "request_id": "cpi-1"}
	for k, v := range c.Context {
		ctx[k] = v
	}
	for k, v := range extra {
		ctx[k] = v
	}
	req, err := rpc.NewRequest(method, 2, ctx, args...)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(req)
	cmd := exec.Command(c.Bin, "-configPath", c.Config)
	cmd.Stdin = strings.NewReader(string(body))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", method, err, stderr.String())
	}
	for _, s := range c.Secrets {
		if s != "" && (strings.Contains(string(out), s) || strings.Contains(stderr.String(), s)) {
			t.Fatalf("%s: a secret came back:\n%s\n%s", method, out, stderr.String())
		}
	}
	r, err := rpc.ParseReply(out)
	if err != nil {
		t.Fatalf("%s: %v", method, err)
	}
	return *r
}

// OK is Call that fails the test on an error response.
func (c Caller) OK(t testing.TB, extra map[string]any, method string, args ...any) json.RawMessage {
	t.Helper()
	r := c.Call(t, extra, method, args...)
	if r.Error != nil {
		t.Fatalf("%s: %s: %s\nlog:\n%s", method, r.Error.Type, r.Error.Message, r.Log)
	}
	return r.Result
}

// VMCID is the CID of create_vm's answer ([cid, networks], or cid).
func VMCID(t testing.TB, raw json.RawMessage) string {
	t.Helper()
	var pair []json.RawMessage
	var cid string
	if json.Unmarshal(raw, &pair) == nil && len(pair) > 0 && json.Unmarshal(pair[0], &cid) == nil {
		return cid
	}
	if json.Unmarshal(raw, &cid) != nil || cid == "" {
		t.Fatalf("create_vm answered %s", raw)
	}
	return cid
}

// HonouredOrRefused checks a cloud property against a closed endpoint:
// refused (refusal != "") means the error says refusal; honoured means
// the call got past the driver's checks and failed on the endpoint,
// whose address the error names.
func HonouredOrRefused(t testing.TB, what, key string, r rpc.Reply, refusal, endpoint string) {
	t.Helper()
	switch {
	case r.Error == nil:
		t.Errorf("%s %s: no error from a closed endpoint", what, key)
	case refusal != "" && !strings.Contains(r.Error.Message, refusal):
		t.Errorf("%s %s: %s; want the refusal %q", what, key, r.Error.Message, refusal)
	case refusal == "" && !strings.Contains(r.Error.Message, endpoint):
		t.Errorf("%s %s: %s; want it accepted (the call reaching %s)", what, key, r.Error.Message, endpoint)
	}
}

// String decodes a result that is one string (a stemcell or disk CID).
func String(t testing.TB, raw json.RawMessage) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(raw, &s); err != nil || s == "" {
		t.Fatalf("want a string result, got %s", raw)
	}
	return s
}

// Configured is a Caller of bin/cpi with driver's executable beside it
// (Path), cfg written as its config file in dir (0600: it holds
// credentials).
func Configured(t testing.TB, dir, driver string, cfg any) Caller {
	t.Helper()
	bin, err := Path(driver)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "cpi.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return Caller{Bin: bin, Config: path}
}

// ContextKeepsItsOwn checks what one cpi-config context (ctx: nil for
// the config file's) made for agent, in a cloud where another context
// (other) is another account or region: has_vm finds the VM through ctx
// and not through other, list_vms by agent lists it once; then the disk,
// the VM and the stemcell are deleted through ctx.
func (c Caller) ContextKeepsItsOwn(t testing.TB, ctx, other map[string]any, agent, vm, disk, stemcell string) {
	t.Helper()
	var has bool
	json.Unmarshal(c.OK(t, ctx, "has_vm", vm), &has)
	if !has {
		t.Errorf("%s: has_vm through its own context is false", agent)
	}
	json.Unmarshal(c.OK(t, other, "has_vm", vm), &has)
	if has {
		t.Errorf("%s: has_vm through the other context found %s", agent, vm)
	}
	var listed []map[string]any
	json.Unmarshal(c.OK(t, ctx, "list_vms", map[string]string{"agent_id": agent}), &listed)
	if len(listed) != 1 {
		t.Errorf("%s: list_vms by agent = %v; want the one VM", agent, listed)
	}
	c.OK(t, ctx, "delete_disk", disk)
	c.OK(t, ctx, "delete_vm", vm)
	c.OK(t, ctx, "delete_stemcell", stemcell)
}

// ListedCIDs are the VM CIDs of a list_vms answer.
func ListedCIDs(raw json.RawMessage) ([]string, error) {
	var vms []struct {
		CID string `json:"cid"`
	}
	if err := json.Unmarshal(raw, &vms); err != nil {
		return nil, fmt.Errorf("list_vms answered %s: %w", raw, err)
	}
	var out []string
	for _, v := range vms {
		out = append(out, v.CID)
	}
	return out, nil
}
