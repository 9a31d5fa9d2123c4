package openstack

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/testkit/cpibin"
	"github.com/runway-cpi/runway/src/testkit/faultproxy"
)

// writeCPIConfig writes dir/<name>.json, a bin/cpi config for the dev
// cloud through authURL with its state in dir/<state> (one state dir is
// one CPI host: its lock files prove a killed call dead).
func writeCPIConfig(t *testing.T, c cloud, dir, name, state, authURL string) string {
	cfg := map[string]any{"driver": "openstack", "state_dir": filepath.Join(dir, state),
		"openstack": map[string]any{"auth_url": authURL, "username": c.user, "password": c.password, "project_name": c.project, "region": c.region}}
	b, _ := json.Marshal(cfg)
	path := filepath.Join(dir, name+".json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

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
	bin, err := cpibin.Path("openstack")
	if err != nil {
		t.Fatal(err)
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
	// One state dir, as on one CPI host: the killed create's lock file
	// proves to the next create that it is dead.
	cfgPath, stuckCfg := writeCPIConfig(t, c, dir, "direct", "state", c.authURL), writeCPIConfig(t, c, dir, "stuck", "state", stuckURL)
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
	cids, err := cpibin.ListedCIDs(call("list_vms", map[string]string{"agent_id": agent}))
	if err != nil {
		t.Fatal(err)
	}
	return cids
}

// TestPortOfACreateInFlightIsKept: a create_vm held between its port and
// its server (the proxy holds its server POST) keeps its fixed IP. Another
// create_vm for the same IP — on the same CPI host (state dir) or on
// another — must not reclaim that port: it gets a clear, retryable error,
// and the first create then succeeds.
func TestPortOfACreateInFlightIsKept(t *testing.T) {
	c := devCloud(t)
	const director, ip = "inflight-director", "10.20.0.92"
	t.Cleanup(func() { assertNoneTagged(t, c, "director", director) })
	dir := t.TempDir()
	bin, err := cpibin.Path("openstack")
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var held atomic.Int32
	heldURL, _ := throughProxy(t, c, func(r faultproxy.Request) faultproxy.Fault {
		if r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/servers") {
			held.Add(1)
			<-release
		}
		return faultproxy.Pass
	})
	var once sync.Once
	releaseAll := func() { once.Do(func() { close(release) }) }
	t.Cleanup(releaseAll)
	heldCfg := writeCPIConfig(t, c, dir, "held", "host-a", heldURL)
	sameHost := writeCPIConfig(t, c, dir, "same-host", "host-a", c.authURL)
	otherHost := writeCPIConfig(t, c, dir, "other-host", "host-b", c.authURL)
	d, _ := newTestDriver(t, c, "", "", nil)
	sc := createStemcell(t, d)
	createVM := func(cfg, agent string) *exec.Cmd {
		req, _ := json.Marshal(map[string]any{"method": "create_vm", "api_version": 2, "context": map[string]any{"director_uuid": director},
			"arguments": []any{agent, sc, map[string]any{"instance_type": "runway.tiny"},
				map[string]any{"private": map[string]any{"type": "manual", "ip": ip, "netmask": "255.255.255.0",
					"cloud_properties": map[string]any{"net_id": c.netID}}}, []string{}, map[string]any{}}})
		cmd := exec.Command(bin, "-configPath", cfg)
		cmd.Stdin = strings.NewReader(string(req))
		return cmd
	}
	type answer struct {
		Result json.RawMessage `json:"result"`
		Error  *struct {
			Type      string `json:"type"`
			Message   string `json:"message"`
			OkToRetry bool   `json:"ok_to_retry"`
		} `json:"error"`
	}
	first := createVM(heldCfg, "inflight-agent-1")
	var firstOut strings.Builder
	first.Stdout = &firstOut
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for held.Load() == 0 {
		if time.Now().After(deadline) {
			first.Process.Kill()
			t.Fatal("the first create_vm never reached its server POST")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for name, cfg := range map[string]string{"same host": sameHost, "other host": otherHost} {
		out, err := createVM(cfg, "inflight-agent-2").Output()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var a answer
		if err := json.Unmarshal(out, &a); err != nil || a.Error == nil {
			t.Fatalf("%s: the second create_vm for %s did not fail: %s", name, ip, out)
		}
		if a.Error.Type != "Bosh::Clouds::VMCreationFailed" || !a.Error.OkToRetry || !strings.Contains(a.Error.Message, "held by port") {
			t.Errorf("%s: %+v; want a retryable VMCreationFailed naming the port that holds the IP", name, a.Error)
		}
	}
	releaseAll()
	if err := first.Wait(); err != nil {
		t.Fatal(err)
	}
	var a answer
	if err := json.Unmarshal([]byte(firstOut.String()), &a); err != nil || a.Error != nil {
		t.Fatalf("the first create_vm failed after the second tried its IP: %s", firstOut.String())
	}
	var pair []json.RawMessage
	json.Unmarshal(a.Result, &pair)
	var vm string
	json.Unmarshal(pair[0], &vm)
	if err := d.DeleteVM(context.Background(), vm); err != nil {
		t.Fatal(err)
	}
}

// TestLostCreateAnswersAreResolvedByLookup: the first port, server,
// volume and snapshot POST each reach the cloud and lose their answer (the
// driver cannot know the outcome). Before sending again, the driver finds
// what the first one made by the call's name or token and adopts it: each
// create is sent once, and nothing is left over.
func TestLostCreateAnswersAreResolvedByLookup(t *testing.T) {
	c := devCloud(t)
	const who = "lost-answers"
	t.Cleanup(func() { assertNoLeftovers(t, c, who) })
	var mu sync.Mutex
	faulted, posts := map[string]bool{}, map[string]int{}
	kind := func(r faultproxy.Request) string {
		if r.Method != "POST" {
			return ""
		}
		for _, k := range []string{"/ports", "/servers", "/volumes", "/snapshots"} {
			if strings.HasSuffix(r.URL.Path, k) {
				return k
			}
		}
		return ""
	}
	authURL, _ := throughProxy(t, c, func(r faultproxy.Request) faultproxy.Fault {
		k := kind(r)
		if k == "" {
			return faultproxy.Pass
		}
		mu.Lock()
		defer mu.Unlock()
		posts[k]++
		if !faulted[k] {
			faulted[k] = true
			return faultproxy.ResetAfter
		}
		return faultproxy.Pass
	})
	d, logs := newTestDriver(t, c, authURL, "", nil)
	ctx := context.Background()
	sc := createStemcell(t, d)
	defer d.DeleteStemcell(ctx, sc)
	tags := map[string]string{"created_by": who, "director": who}
	vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "lost-agent", StemcellCID: sc, Tags: tags,
		CloudProps: driver.PropsOf(map[string]any{"instance_type": "runway.tiny"}),
		Networks:   driver.Networks{"private": {Type: "manual", IP: "10.20.0.93", CloudProperties: driver.PropsOf(map[string]any{"net_id": c.netID})}}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteVM(ctx, vm.CID)
	disk, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 1024, Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteDisk(ctx, disk)
	snap, err := d.SnapshotDisk(ctx, disk, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteSnapshot(ctx, snap)
	for _, k := range []string{"/ports", "/servers", "/volumes", "/snapshots"} {
		if !faulted[k] || posts[k] != 1 {
			t.Errorf("POST %s: faulted %v, sent %d times; want one POST, its lost answer resolved by lookup", k, faulted[k], posts[k])
		}
	}
	if n := strings.Count(logs.String(), "an earlier attempt made it; adopting it"); n != 4 {
		t.Errorf("%d adoptions logged, want 4", n)
	}
}
