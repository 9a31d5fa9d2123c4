// Package e2e drives the real binaries: `runway serve` as a subprocess,
// calling the real bin/cpi on the local driver, whose VMs run the real
// test runner program against the forge contract servers.
package e2e

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/cpiclient"
	"github.com/runway-cpi/runway/src/orchestrator"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/httpapi"
	"github.com/runway-cpi/runway/src/testkit/cpibin"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
	"github.com/runway-cpi/runway/src/testkit/testlog"
)

var bins struct{ cpi, runway, testrunner, stemcell string }

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "runway-e2e-")
	if err != nil {
		panic(err)
	}
	if bins.cpi, err = cpibin.Path("local"); err != nil {
		panic(err)
	}
	built, err := cpibin.Build("github.com/runway-cpi/runway/src/cmd/runway", "github.com/runway-cpi/runway/src/testkit/forgetest/testrunner")
	if err != nil {
		panic(err)
	}
	bins.runway, bins.testrunner = filepath.Join(built, "runway"), filepath.Join(built, "testrunner")
	bins.stemcell = filepath.Join(dir, "stemcell.tgz")
	if err := writeStemcell(bins.stemcell); err != nil {
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// writeStemcell makes a one-file image tarball for the local driver.
func writeStemcell(path string) error {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	body := []byte("runner image\n")
	if err := tw.WriteHeader(&tar.Header{Name: "image", Mode: 0o644, Size: int64(len(body))}); err != nil {
		return err
	}
	tw.Write(body)
	tw.Close()
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

const (
	apiToken      = "api-token-0123456789"
	webhookSecret = "hook-secret-abcdef"
	directorUUID  = "orch-e2e"
)

// env is one orchestrator under test with its forge and CPI state.
type env struct {
	t        testing.TB
	dir      string
	cpiCfg   string
	cfgPath  string
	gitea    *forgetest.Gitea
	github   *forgetest.GitHub
	hold     string // while this file exists, test runners keep their job
	stall    string // test runners started while this file exists never register
	timeouts string // the groups' timeouts (YAML flow map); a default if ""
	daemon   *exec.Cmd
	stderr   *testlog.Buffer
	addr     string
	exited   chan struct{}
	forgeYML string
	extraEnv []string // for the daemon, beyond PATH and HOME
	sweep    string   // sweep_interval (default 1s: a pass every second)
	top      string   // more top-level YAML (store: postgres, ...)
	// cpiPath, runnerPath and stemcell replace bins.cpi, bins.testrunner
	// and bins.stemcell when set (container mode).
	cpiPath, runnerPath, stemcell string
}

// newEnv writes the CPI config and starts the Gitea contract server.
func newEnv(t testing.TB) *env {
	e := &env{t: t, dir: t.TempDir()}
	e.hold = filepath.Join(e.dir, "hold")
	e.stall = filepath.Join(e.dir, "runner-never-registers")
	e.cpiCfg = filepath.Join(e.dir, "cpi.json")
	e.writeCPIConfig("local", map[string]any{"stop_grace_seconds": 1})
	must(t, os.WriteFile(filepath.Join(e.dir, "api-token"), []byte(apiToken+"\n"), 0o600))
	must(t, os.WriteFile(filepath.Join(e.dir, "hook-secret"), []byte(webhookSecret), 0o600))
	e.gitea = forgetest.NewGitea(apiToken)
	t.Cleanup(e.gitea.Close)
	t.Cleanup(e.cleanup)
	return e
}

// writeCPIConfig writes bin/cpi's config: driver with its section, its
// state in the env's dir.
func (e *env) writeCPIConfig(driver string, section any) {
	b, _ := json.Marshal(map[string]any{"driver": driver, "state_dir": filepath.Join(e.dir, "cpi-state"), driver: section})
	must(e.t, os.WriteFile(e.cpiCfg, b, 0o600))
}

// holdJobs makes the test runners keep the jobs they take until
// releaseJobs.
func (e *env) holdJobs() { must(e.t, os.WriteFile(e.hold, nil, 0o600)) }

func (e *env) releaseJobs() { must(e.t, os.Remove(e.hold)) }

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// group renders one group's YAML with the test runner as its command.
func (e *env) group(name, scopeYAML string, labels []string, maxActive int, extra string) string {
	ls, _ := json.Marshal(labels)
	return fmt.Sprintf(`
  - name: %s
    %s
    labels: %s
    max_active_runners: %d
    stemcell: {image: %q}
    cloud_properties: {}
    runner:
      command: %q
      env: {TESTRUNNER_HOLD_FILE: %q, TESTRUNNER_STALL_FILE: %q, TESTRUNNER_IDLE: "60s"}
    timeouts: %s
%s`, name, scopeYAML, ls, maxActive, cmp.Or(e.stemcell, bins.stemcell), cmp.Or(e.runnerPath, bins.testrunner), e.hold, e.stall,
		cmp.Or(e.timeouts, "{spawn: 2m, idle: 2m, max_lifetime: 10m}"), extra)
}

// cpiAt is a group's line running its CPI calls through the executable
// at path (a wrapper around bin/cpi).
func cpiAt(path string) string { return fmt.Sprintf("    cpi: {path: %q}\n", path) }

// giteaForge renders the Gitea server's forge entry; runnerURL, when
// set, is where runner VMs reach it.
func (e *env) giteaForge(runnerURL, pollInterval string) string {
	if runnerURL != "" {
		runnerURL = "\n    runner_url: " + runnerURL
	}
	return fmt.Sprintf(`
  - name: gitea
    type: gitea
    url: %s%s
    token_file: %s
    webhook_secret_file: %s
    poll_interval: %s`, e.gitea.URL, runnerURL, filepath.Join(e.dir, "api-token"), filepath.Join(e.dir, "hook-secret"), pollInterval)
}

// writeConfig writes runway.yml for the given groups (forge: the Gitea
// server unless forgeYML is set).
func (e *env) writeConfig(pollInterval string, groups ...string) {
	forges := e.forgeYML
	if forges == "" {
		forges = e.giteaForge("", pollInterval)
	}
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
state_dir: %s
log_level: debug
sweep_interval: %s
%s
cpi:
  path: %s
  config: %s
  timeout: 60s
  director_uuid: %s
forges:%s
groups:%s`, filepath.Join(e.dir, "orch"), cmp.Or(e.sweep, "1s"), e.top, cmp.Or(e.cpiPath, bins.cpi), e.cpiCfg, directorUUID, forges, strings.Join(groups, ""))
	e.cfgPath = filepath.Join(e.dir, "runway.yml")
	must(e.t, os.WriteFile(e.cfgPath, []byte(cfg), 0o600))
	if _, err := config.LoadConfig(e.cfgPath); err != nil {
		e.t.Fatalf("test config does not load: %v", err)
	}
}

// start runs `runway serve` and waits until it answers /healthz.
func (e *env) start() {
	e.t.Helper()
	os.Remove(filepath.Join(e.dir, "orch", "listen.addr"))
	cmd := exec.Command(bins.runway, "serve", "-config", e.cfgPath)
	e.stderr = &testlog.Buffer{}
	cmd.Stdout, cmd.Stderr = e.stderr, e.stderr
	cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + e.dir}, e.extraEnv...)
	must(e.t, cmd.Start())
	e.daemon = cmd
	e.exited = make(chan struct{})
	go func() { cmd.Wait(); close(e.exited) }()
	e.addr = e.waitHealthy("runway serve", filepath.Join(e.dir, "orch"), e.exited, e.stderr)
}

// waitHealthy waits until the daemon whose state dir is dir answers
// /healthz at the address it wrote there, and returns that address.
func (e *env) waitHealthy(what, dir string, exited chan struct{}, out *testlog.Buffer) string {
	e.t.Helper()
	var addr string
	e.eventually(20*time.Second, what+" answers /healthz", func() bool {
		select {
		case <-exited:
			e.t.Fatalf("%s exited: %s", what, out.String())
		default:
		}
		b, err := os.ReadFile(filepath.Join(dir, "listen.addr"))
		if err != nil {
			return false
		}
		addr = strings.TrimSpace(string(b))
		resp, err := http.Get("http://" + addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return addr
}

// stop ends the daemon with SIGTERM (kill9: SIGKILL) and waits.
func (e *env) stop(kill9 bool) {
	sig := syscall.SIGTERM
	if kill9 {
		sig = syscall.SIGKILL
	}
	stopProcess(e.t, "runway serve", e.daemon, e.exited, sig)
	e.daemon = nil
}

// stopProcess signals cmd (if started) and waits for it to exit (exited
// closed), killing it after 30 s.
func stopProcess(t testing.TB, what string, cmd *exec.Cmd, exited chan struct{}, sig syscall.Signal) {
	if cmd == nil {
		return
	}
	cmd.Process.Signal(sig)
	select {
	case <-exited:
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-exited
		t.Errorf("%s did not stop on %v", what, sig)
	}
}

// cleanup stops the daemon and deletes every VM left, so no test runner
// outlives the test (and says so if the orchestrator left any).
func (e *env) cleanup() {
	e.stop(false)
	os.Remove(e.hold)
	for _, vm := range e.vms() {
		e.cpi().Call(context.Background(), "delete_vm", "cleanup", vm.CID)
	}
	if e.stderr != nil {
		out := e.stderr.String()
		for _, secret := range []string{apiToken, webhookSecret} {
			if strings.Contains(out, secret) {
				e.t.Errorf("runway serve logged a secret (%.6s...)", secret)
			}
		}
		if e.t.Failed() {
			e.t.Logf("runway serve output:\n%s", strings.NewReplacer(apiToken, "<api token>", webhookSecret, "<webhook secret>").Replace(out))
		}
	}
}

func (e *env) cpi() *cpiclient.Client {
	return &cpiclient.Client{Path: cmp.Or(e.cpiPath, bins.cpi), ConfigPath: e.cpiCfg, DirectorUUID: "e2e-observer", Timeout: 30 * time.Second}
}

type vm struct {
	CID     string            `json:"cid"`
	AgentID string            `json:"agent_id"`
	State   string            `json:"state"`
	Tags    map[string]string `json:"tags"`
}

// vms lists the orchestrator's VMs through bin/cpi (what really exists).
func (e *env) vms() []vm {
	resp, err := e.cpi().Call(context.Background(), "list_vms", "observe", map[string]string{"director": directorUUID})
	if err != nil {
		e.t.Fatalf("list_vms: %v", err)
	}
	var out []vm
	must(e.t, json.Unmarshal(resp.Result, &out))
	return out
}

func (e *env) get(path string, out any) {
	e.t.Helper()
	resp, err := http.Get("http://" + e.addr + path)
	must(e.t, err)
	defer resp.Body.Close()
	must(e.t, json.NewDecoder(resp.Body).Decode(out))
}

func (e *env) runners(all bool) []httpapi.RunnerView {
	var rs []httpapi.RunnerView
	p := "/api/v1/runners"
	if all {
		p += "?all=true"
	}
	e.get(p, &rs)
	return rs
}

func (e *env) groupStatus(name string) orchestrator.GroupStatus {
	var gs []orchestrator.GroupStatus
	e.get("/api/v1/groups", &gs)
	for _, g := range gs {
		if g.Name == name {
			return g
		}
	}
	e.t.Fatalf("no group %s in /api/v1/groups", name)
	return orchestrator.GroupStatus{}
}

// metrics is the daemon's /metrics text ("" when it cannot be read).
func (e *env) metrics() string {
	resp, err := http.Get("http://" + e.addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// eventually polls cond (a condition wait, not a sleep standing in for
// synchronisation) until it holds or the timeout passes.
func (e *env) eventually(timeout time.Duration, what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out after %s waiting for: %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runway runs the CLI against the daemon.
func (e *env) runway(args ...string) (string, error) {
	cmd := exec.Command(bins.runway, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + e.dir}
	out, err := cmd.CombinedOutput()
	return string(out), err
}
