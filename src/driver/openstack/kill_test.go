package openstack

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/testkit/faultproxy"
)

// TestKilledCreateVM: bin/cpi killed with SIGKILL in the middle of
// create_vm — once after its port but before any server, once after the
// server exists —
// leaves nothing a later call cannot remove: the next create_vm for the
// same fixed IP reclaims the orphaned port, and list_vms by agent plus
// delete_vm removes the orphaned server and its port.
func TestKilledCreateVM(t *testing.T) {
	c := devCloud(t)
	const director = "kill9-director"
	t.Cleanup(func() { assertNoneTagged(t, c, "director", director) })
	dir := t.TempDir()
	bin := filepath.Join(dir, "cpi")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/runway-cpi/runway/src/cmd/cpi").CombinedOutput(); err != nil {
		t.Fatalf("building bin/cpi: %v\n%s", err, out)
	}
	// Through a proxy that resets every server POST, a create_vm stays
	// alive with its port made and no server: the first kill point,
	// without racing the clock.
	var serverPosts atomic.Int32
	stuckURL, _ := throughProxy(t, c, func(r faultproxy.Request) faultproxy.Fault {
		if r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/servers") {
			serverPosts.Add(1)
			return faultproxy.ResetBefore
		}
		return faultproxy.Pass
	})
	writeConfig := func(name, authURL string) string {
		cfg := map[string]any{"driver": "openstack", "state_dir": filepath.Join(dir, "state-"+name),
			"openstack": map[string]any{"auth_url": authURL, "username": c.user, "password": c.password, "project_name": c.project, "region": c.region}}
		b, _ := json.Marshal(cfg)
		path := filepath.Join(dir, name+".json")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	cfgPath, stuckCfg := writeConfig("direct", c.authURL), writeConfig("stuck", stuckURL)
	d, _ := newTestDriver(t, c, "", "", nil)
	sc := createStemcell(t, d)
	a := newAdmin(t, c)

	request := func(method string, args ...any) []byte {
		r, _ := json.Marshal(map[string]any{"method": method, "arguments": args, "api_version": 2,
			"context": map[string]any{"director_uuid": director}})
		return r
	}
	nets := func(ip string) map[string]any {
		return map[string]any{"private": map[string]any{"type": "manual", "ip": ip, "netmask": "255.255.255.0",
			"cloud_properties": map[string]any{"net_id": c.netID}}}
	}
	call := func(method string, args ...any) json.RawMessage {
		t.Helper()
		cmd := exec.Command(bin, "-configPath", cfgPath)
		cmd.Stdin = strings.NewReader(string(request(method, args...)))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		var resp struct {
			Result json.RawMessage `json:"result"`
			Error  *struct{ Type, Message string }
		}
		if err := json.Unmarshal(out, &resp); err != nil || resp.Error != nil {
			t.Fatalf("%s: %s %v", method, out, err)
		}
		return resp.Result
	}
	// killWhen starts create_vm and SIGKILLs it as soon as seen() is true.
	killWhen := func(cfg, agent, ip string, seen func() bool) {
		t.Helper()
		cmd := exec.Command(bin, "-configPath", cfg)
		cmd.Stdin = strings.NewReader(string(request("create_vm", agent, sc, map[string]any{"instance_type": "runway.tiny"}, nets(ip), []string{}, map[string]any{})))
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(60 * time.Second)
		for !seen() {
			if time.Now().After(deadline) {
				cmd.Process.Kill()
				t.Fatalf("create_vm of %s never got that far", agent)
			}
			time.Sleep(20 * time.Millisecond)
		}
		cmd.Process.Kill()
		cmd.Wait()
	}

	// 1. Killed after its port, before any server: nothing for list_vms.
	killWhen(stuckCfg, "kill9-agent-1", "10.20.0.90", func() bool { return serverPosts.Load() > 0 })
	if ps := a.ports(t, "fixed_ips=ip_address%3D10.20.0.90"); len(ps) != 1 || ps[0].DeviceID != "" {
		t.Fatalf("after the first kill, ports on 10.20.0.90 = %+v; want one unbound", ps)
	}
	if vms := listVMs(t, call, "kill9-agent-1"); len(vms) != 0 {
		t.Fatalf("a server exists although every server POST was reset: %v", vms)
	}
	// The same address for the next VM: an orphaned port must not block it.
	var pair []json.RawMessage
	if err := json.Unmarshal(call("create_vm", "kill9-agent-2", sc, map[string]any{"instance_type": "runway.tiny"}, nets("10.20.0.90"), []string{}, map[string]any{}), &pair); err != nil {
		t.Fatal(err)
	}
	var vm string
	json.Unmarshal(pair[0], &vm)
	call("delete_vm", vm)

	// 2. Killed once the server exists: list_vms by agent finds it, and
	// delete_vm removes it and its port.
	killWhen(cfgPath, "kill9-agent-3", "10.20.0.91", func() bool {
		return len(a.list(t, "compute", "servers?all_tenants=1&tags=agent_id%3Dkill9-agent-3", "servers")) > 0
	})
	vms := listVMs(t, call, "kill9-agent-3")
	if len(vms) != 1 {
		t.Fatalf("list_vms by agent after the kill = %v; want the one server", vms)
	}
	call("delete_vm", vms[0])
	if left := a.ports(t, "fixed_ips=ip_address%3D10.20.0.91"); len(left) != 0 {
		t.Errorf("the killed create's port survived delete_vm: %+v", left)
	}
}

func listVMs(t *testing.T, call func(string, ...any) json.RawMessage, agent string) []string {
	t.Helper()
	var vms []struct {
		CID string `json:"cid"`
	}
	raw := call("list_vms", map[string]string{"agent_id": agent})
	if err := json.Unmarshal(raw, &vms); err != nil {
		t.Fatalf("list_vms answer %s: %v", raw, err)
	}
	var out []string
	for _, v := range vms {
		out = append(out, v.CID)
	}
	return out
}
