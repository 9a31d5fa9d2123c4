package garm_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cloudbase/garm-provider-common/params"

	"github.com/runway-cpi/runway/src/cpiclient"
	"github.com/runway-cpi/runway/src/testkit/cpibin"
)

// The harness plays garm: it builds bin/cpi once and runs it with exactly
// the environment garm builds (cleared: no PATH, no HOME), per interface
// version, with the bootstrap JSON on stdin.

var cpiBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "garm-harness-")
	if err != nil {
		panic(err)
	}
	if cpiBin, err = cpibin.Path("local"); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

type garm struct {
	t          *testing.T
	config     string
	state      string
	controller string
	version    string
	bin        string // bin/cpi (default: cpiBin, with the local driver)
}

func newGarm(t *testing.T, version string, cfg map[string]any) *garm {
	dir := t.TempDir()
	g := &garm{t: t, config: filepath.Join(dir, "runway.json"), state: filepath.Join(dir, "state"), controller: "ctl-1", version: version}
	if cfg == nil {
		cfg = map[string]any{}
	}
	cfg["driver"], cfg["state_dir"] = "local", g.state
	cfg["local"] = map[string]any{"stop_grace_seconds": 1}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(g.config, b, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.run("RemoveAllInstances", "", "", nil) })
	return g
}

// newCloudGarm is garm on the executable bin of a cloud driver with its
// config section, as an operator sets it up: the image made a stemcell
// (create_stemcell with props), mapped as the pool's "ubuntu", and the
// rest of the garm section (flavors, networks) as given.
func newCloudGarm(t *testing.T, driver, bin string, section map[string]any, controller, image string, props map[string]any, garmSection map[string]any) *garm {
	dir := t.TempDir()
	cfg := map[string]any{"driver": driver, "state_dir": filepath.Join(dir, "state"), driver: section}
	write := func() string {
		p := filepath.Join(dir, "runway.json")
		b, _ := json.Marshal(cfg)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c := &cpiclient.Client{Path: bin, ConfigPath: write(), DirectorUUID: "garm-test", Timeout: time.Minute}
	resp, err := c.Call(context.Background(), "create_stemcell", "garm", image, props)
	if err != nil {
		t.Fatal(err)
	}
	var sc string
	if err := json.Unmarshal(resp.Result, &sc); err != nil {
		t.Fatal(err)
	}
	if garmSection == nil {
		garmSection = map[string]any{}
	}
	garmSection["images"] = map[string]any{"ubuntu": map[string]any{"stemcell": sc}}
	cfg["garm"] = garmSection
	g := &garm{t: t, config: write(), controller: controller, version: "v0.1.1", bin: bin}
	t.Cleanup(func() { g.run("RemoveAllInstances", "", "", nil) })
	return g
}

type result struct {
	code           int
	stdout, stderr string
}

// run executes one command as garm would.
func (g *garm) run(command, pool, instance string, stdin []byte, extra ...string) result {
	cmd := exec.Command(cmp.Or(g.bin, cpiBin))
	cmd.Env = []string{"GARM_COMMAND=" + command, "GARM_CONTROLLER_ID=" + g.controller, "GARM_PROVIDER_CONFIG_FILE=" + g.config}
	if g.version != "" {
		cmd.Env = append(cmd.Env, "GARM_INTERFACE_VERSION="+g.version)
	}
	if pool != "" {
		cmd.Env = append(cmd.Env, "GARM_POOL_ID="+pool)
	}
	if instance != "" {
		cmd.Env = append(cmd.Env, "GARM_INSTANCE_ID="+instance)
	}
	cmd.Env = append(cmd.Env, extra...)
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		g.t.Fatal(err)
	}
	return result{code, out.String(), errb.String()}
}

func (g *garm) ok(command, pool, instance string, stdin []byte, extra ...string) string {
	g.t.Helper()
	r := g.run(command, pool, instance, stdin, extra...)
	if r.code != 0 {
		g.t.Fatalf("%s exited %d\nstdout: %s\nstderr: %s", command, r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

func bootstrap(name, pool string, extraSpecs string) []byte {
	bi := params.BootstrapInstance{
		Name: name, PoolID: pool, OSType: params.Linux, OSArch: params.Amd64, Flavor: "small", Image: "ubuntu",
		RepoURL: "https://github.com/example/repo", CallbackURL: "http://127.0.0.1:1/api/v1/callbacks",
		MetadataURL: "http://127.0.0.1:1/api/v1/metadata", InstanceToken: "instance-token-secret-4242",
		Labels: []string{"self-hosted", "runway"},
		Tools: []params.RunnerApplicationDownload{{OS: strPtr("linux"), Architecture: strPtr("x64"),
			DownloadURL: strPtr("http://127.0.0.1:1/actions-runner-linux-x64.tar.gz"), Filename: strPtr("actions-runner-linux-x64.tar.gz")}},
	}
	if extraSpecs != "" {
		bi.ExtraSpecs = json.RawMessage(extraSpecs)
	}
	b, _ := json.Marshal(bi)
	return b
}

func strPtr(s string) *string { return &s }

// quiet is extra specs whose user data is a harmless long-running process.
const quiet = `{"user_data": "#!/bin/sh\nexec sleep 600\n"}`

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("stdout is not the expected JSON: %v\n%s", err, s)
	}
	return v
}

// rawInstance checks provider_fault's wire type too.
type rawInstance struct {
	ProviderID    string           `json:"provider_id"`
	Name          string           `json:"name"`
	OSType        string           `json:"os_type"`
	OSArch        string           `json:"os_arch"`
	Status        string           `json:"status"`
	Addresses     []params.Address `json:"addresses"`
	ProviderFault *string          `json:"provider_fault"`
}

func TestInformationalCommands(t *testing.T) {
	for _, v := range []string{"", "v0.1.0", "v0.1.1"} {
		g := newGarm(t, v, nil)
		if got := strings.TrimSpace(g.ok("GetVersion", "", "", nil)); got != "v0.1.0" {
			t.Errorf("GetVersion = %q", got)
		}
	}
	g := newGarm(t, "v0.1.1", nil)
	if got := decode[[]string](t, g.ok("GetSupportedInterfaceVersions", "", "", nil)); strings.Join(got, ",") != "v0.1.0,v0.1.1" {
		t.Errorf("versions = %v", got)
	}
	for _, cmd := range []string{"GetConfigJSONSchema", "GetExtraSpecsJSONSchema"} {
		schema := decode[map[string]any](t, g.ok(cmd, "", "", nil))
		if schema["type"] != "object" || schema["properties"] == nil {
			t.Errorf("%s is not a JSON schema: %v", cmd, schema)
		}
	}
}

func TestCreateIsIdempotentAndEverythingIsFoundByIdOrName(t *testing.T) {
	for _, v := range []string{"v0.1.0", "v0.1.1"} {
		t.Run(v, func(t *testing.T) {
			g := newGarm(t, v, nil) // a bare config: no image or flavor mapping
			first := decode[rawInstance](t, g.ok("CreateInstance", "pool-a", "", bootstrap("runner-1", "pool-a", quiet)))
			if first.ProviderID == "" || first.Name != "runner-1" || first.Status != "running" || first.OSType != "linux" || first.OSArch != "amd64" {
				t.Fatalf("created %+v", first)
			}
			if len(first.Addresses) == 0 || first.Addresses[0].Type != params.PrivateAddress {
				t.Errorf("addresses %+v", first.Addresses)
			}
			again := decode[rawInstance](t, g.ok("CreateInstance", "pool-a", "", bootstrap("runner-1", "pool-a", quiet)))
			if again.ProviderID != first.ProviderID {
				t.Fatalf("second CreateInstance made %s, want the existing %s", again.ProviderID, first.ProviderID)
			}
			list := decode[[]rawInstance](t, g.ok("ListInstances", "pool-a", "", nil))
			if len(list) != 1 {
				t.Fatalf("list = %+v; want exactly one", list)
			}
			for _, id := range []string{first.ProviderID, "runner-1"} {
				got := decode[rawInstance](t, g.ok("GetInstance", "pool-a", id, nil))
				if got.ProviderID != first.ProviderID {
					t.Errorf("GetInstance(%s) = %+v", id, got)
				}
			}
			if r := g.run("GetInstance", "pool-a", "runner-404", nil); r.code != 30 || r.stdout != "" {
				t.Errorf("GetInstance of an unknown instance: exit %d, stdout %q; want 30 and nothing", r.code, r.stdout)
			}
			g.ok("DeleteInstance", "pool-a", "runner-1", nil) // by name
			if r := g.run("GetInstance", "pool-a", first.ProviderID, nil); r.code != 30 {
				t.Errorf("instance survived DeleteInstance: exit %d", r.code)
			}
			g.ok("DeleteInstance", "pool-a", first.ProviderID, nil) // absent: no-op, exit 0
		})
	}
}

func TestRunnerUserDataRunsAsTheVMProcess(t *testing.T) {
	g := newGarm(t, "v0.1.1", nil)
	inst := decode[rawInstance](t, g.ok("CreateInstance", "pool-a", "", bootstrap("runner-ud", "pool-a", "")))
	ud, err := os.ReadFile(filepath.Join(g.state, "vms", inst.ProviderID, "user-data"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"#!/bin/bash", `METADATA_URL="http://127.0.0.1:1/api/v1/metadata"`, "actions-runner-linux-x64.tar.gz"} {
		if !strings.Contains(string(ud), want) {
			t.Errorf("rendered install script lacks %q", want)
		}
	}
	vm, _ := os.ReadFile(filepath.Join(g.state, "vms", inst.ProviderID, "vm.json"))
	if !strings.Contains(string(vm), `"command"`) {
		t.Errorf("the install script is not the VM's process: %s", vm)
	}
}

func TestPoolAndControllerIsolation(t *testing.T) {
	g := newGarm(t, "v0.1.1", nil)
	a := decode[rawInstance](t, g.ok("CreateInstance", "pool-a", "", bootstrap("runner-a", "pool-a", quiet)))
	g.ok("CreateInstance", "pool-b", "", bootstrap("runner-b", "pool-b", quiet))
	if list := decode[[]rawInstance](t, g.ok("ListInstances", "pool-a", "", nil)); len(list) != 1 || list[0].Name != "runner-a" {
		t.Fatalf("pool-a lists %+v", list)
	}

	other := *g
	other.controller = "ctl-2"
	other.t = t
	if list := decode[[]rawInstance](t, other.ok("ListInstances", "pool-a", "", nil)); len(list) != 0 {
		t.Fatalf("a foreign controller sees %+v", list)
	}
	if r := other.run("GetInstance", "pool-a", a.ProviderID, nil); r.code != 30 {
		t.Fatalf("a foreign controller gets another's instance: exit %d", r.code)
	}
	other.ok("DeleteInstance", "pool-a", a.ProviderID, nil)
	other.ok("RemoveAllInstances", "", "", nil)
	if len(decode[[]rawInstance](t, g.ok("ListInstances", "pool-a", "", nil))) != 1 {
		t.Fatal("a foreign controller deleted our instance")
	}
	g.ok("RemoveAllInstances", "", "", nil)
	for _, pool := range []string{"pool-a", "pool-b"} {
		if list := decode[[]rawInstance](t, g.ok("ListInstances", pool, "", nil)); len(list) != 0 {
			t.Fatalf("RemoveAllInstances left %+v in %s", list, pool)
		}
	}
}

func TestStartStopBothSpellings(t *testing.T) {
	g := newGarm(t, "v0.1.1", nil)
	inst := decode[rawInstance](t, g.ok("CreateInstance", "pool-a", "", bootstrap("runner-p", "pool-a", quiet)))
	for _, pair := range [][2]string{{"StopInstance", "StartInstance"}, {"Stop", "Start"}} {
		g.ok(pair[0], "pool-a", inst.ProviderID, nil)
		if got := decode[rawInstance](t, g.ok("GetInstance", "pool-a", inst.ProviderID, nil)); got.Status != "stopped" {
			t.Fatalf("after %s: %s", pair[0], got.Status)
		}
		g.ok(pair[1], "pool-a", "runner-p", nil)
		if got := decode[rawInstance](t, g.ok("GetInstance", "pool-a", inst.ProviderID, nil)); got.Status != "running" {
			t.Fatalf("after %s: %s", pair[1], got.Status)
		}
	}
	if r := g.run("StartInstance", "pool-a", "nope", nil); r.code != 30 {
		t.Fatalf("start of an unknown instance: exit %d", r.code)
	}
}

func TestExtraSpecsAreApplied(t *testing.T) {
	g := newGarm(t, "v0.1.1", nil)
	specs := base64.StdEncoding.EncodeToString([]byte(`{"cloud_properties": {"env": {"RUNWAY_POOL_MARK": "blue"}}, "user_data": "#!/bin/sh\nexec sleep 600\n"}`))
	inst := decode[rawInstance](t, g.ok("CreateInstance", "pool-a", "", bootstrap("runner-x", "pool-a", ""), "GARM_POOL_EXTRASPECS="+specs))
	vm, _ := os.ReadFile(filepath.Join(g.state, "vms", inst.ProviderID, "vm.json"))
	if !strings.Contains(string(vm), "RUNWAY_POOL_MARK") {
		t.Fatalf("extra specs cloud properties not applied: %s", vm)
	}
	bad := base64.StdEncoding.EncodeToString([]byte(`{"flavour": "big"}`))
	if r := g.run("ValidatePoolInfo", "", "", nil, "GARM_POOL_EXTRASPECS="+bad); r.code == 0 || !strings.Contains(r.stderr, `extra specs: unknown key "flavour"`) {
		t.Fatalf("bad extra specs validated: %+v", r)
	}
	good := base64.StdEncoding.EncodeToString([]byte(`{"cloud_properties": {}}`))
	g.ok("ValidatePoolInfo", "", "", nil, "GARM_POOL_EXTRASPECS="+good)
}

func TestImageAndFlavorMapping(t *testing.T) {
	g := newGarm(t, "v0.1.1", map[string]any{"garm": map[string]any{
		"images":  map[string]any{"ubuntu": map[string]any{"stemcell": "sc-does-not-exist"}},
		"flavors": map[string]any{"small": map[string]any{"env": map[string]any{"SIZE": "small"}}}}})
	r := g.run("CreateInstance", "pool-a", "", bootstrap("runner-m", "pool-a", quiet))
	if r.code != 1 || !strings.Contains(r.stderr, "stemcell not found: sc-does-not-exist") || r.stdout != "" {
		t.Fatalf("mapped image with a missing stemcell: %+v", r)
	}
	if list := decode[[]rawInstance](t, g.ok("ListInstances", "pool-a", "", nil)); len(list) != 0 {
		t.Fatalf("failed create left %+v", list)
	}
	if r := g.run("ValidatePoolInfo", "", "", []byte(`{"image": "windows", "flavor": "small"}`)); r.code != 1 || !strings.Contains(r.stderr, `image "windows" has no mapping`) {
		t.Fatalf("unmapped image validated: %+v", r)
	}
}

func TestFailedCreateLeavesNothingAndHooksApply(t *testing.T) {
	hooksDir := hookScript(t, "create_vm-pre.d", "10-deny", "echo \"no runners for $CPI_AGENT_ID\"\nexit 1")
	g := newGarm(t, "v0.1.1", map[string]any{"hooks": map[string]any{"dir": hooksDir}})
	r := g.run("CreateInstance", "pool-a", "", bootstrap("runner-h", "pool-a", quiet))
	if r.code != 1 || !strings.Contains(r.stderr, "no runners for runner-h") || r.stdout != "" {
		t.Fatalf("denied create: %+v", r)
	}
	if strings.Contains(r.stderr, "instance-token-secret-4242") {
		t.Fatal("the instance token reached the log")
	}
	entries, _ := os.ReadDir(filepath.Join(g.state, "vms"))
	if len(entries) != 0 {
		t.Fatalf("vms left: %v", entries)
	}
}

func TestKillDuringCreateThenDeleteByName(t *testing.T) {
	// The post hook holds CreateInstance after the VM exists: the moment
	// garm's bootstrap timeout would SIGKILL a slow provider.
	hooksDir := hookScript(t, "create_vm-post.d", "10-slow", "exec sleep 60")
	g := newGarm(t, "v0.1.1", map[string]any{"hooks": map[string]any{"dir": hooksDir}})
	cmd := exec.Command(cpiBin)
	cmd.Env = []string{"GARM_COMMAND=CreateInstance", "GARM_CONTROLLER_ID=ctl-1", "GARM_PROVIDER_CONFIG_FILE=" + g.config,
		"GARM_INTERFACE_VERSION=v0.1.1", "GARM_POOL_ID=pool-a"}
	cmd.Stdin = bytes.NewReader(bootstrap("runner-k", "pool-a", quiet))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		entries, _ := os.ReadDir(filepath.Join(g.state, "vms"))
		var vms int
		for _, e := range entries {
			if !strings.HasPrefix(e.Name(), ".") {
				vms++
			}
		}
		if vms == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the VM never appeared")
		}
		time.Sleep(10 * time.Millisecond)
	}
	syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	cmd.Wait()
	g.ok("DeleteInstance", "pool-a", "runner-k", nil)
	entries, _ := os.ReadDir(filepath.Join(g.state, "vms"))
	if len(entries) != 0 {
		t.Fatalf("DeleteInstance by name left %v", entries)
	}
}

func TestBadInput(t *testing.T) {
	g := newGarm(t, "v0.1.1", nil)
	for name, r := range map[string]result{
		"malformed stdin": g.run("CreateInstance", "pool-a", "", []byte("{not json")),
		"unknown command": g.run("FlyInstance", "pool-a", "", nil),
		"bad version":     g.run("GetVersion", "", "", nil, "GARM_INTERFACE_VERSION=v9"),
	} {
		if r.code != 1 || r.stdout != "" || r.stderr == "" {
			t.Errorf("%s: exit %d stdout %q stderr %q; want 1, nothing, a message", name, r.code, r.stdout, r.stderr)
		}
	}
	missing := *g
	missing.config = "/nonexistent/runway.json"
	if r := missing.run("ListInstances", "pool-a", "", nil); r.code != 1 || !strings.Contains(r.stderr, "/nonexistent/runway.json") {
		t.Errorf("missing config: %+v", r)
	}
}

// hookScript makes a hooks directory holding one shell script, dir/name.
func hookScript(t *testing.T, dir, name, body string) string {
	hooks := t.TempDir()
	if err := os.MkdirAll(filepath.Join(hooks, dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(hooks, dir, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return hooks
}
