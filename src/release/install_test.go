package release

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/testkit/forgetest"
	"github.com/runway-cpi/runway/src/testkit/realinputs"
)

// The release as an operator gets it: the tarball is built (twice: same
// fingerprints and bytes), unpacked, each package compiled the way the BOSH
// agent does it (cleared environment, BOSH_* targets, dependency order) and
// each job rendered and installed under a /var/vcap-like root that is not
// /var/vcap. Then the installed bin/cpi wrapper runs a whole local-driver
// lifecycle with the Director's cleared environment, asking info before
// every method as bosh-cli does, and the orchestrator job's ctl starts the
// daemon, which makes a runner VM through the colocated CPI job.
func TestReleaseInstallsAndRunsLikeTheAgent(t *testing.T) {
	if _, err := exec.LookPath("ruby"); err != nil {
		t.Fatal("ruby is required to render job templates (scripts/test installs it)")
	}
	root := repoRoot(t)
	work := t.TempDir()
	tarballs := []string{filepath.Join(work, "a.tgz"), filepath.Join(work, "b.tgz")}
	var manifests []*Manifest
	for _, tb := range tarballs {
		if err := Stage(root); err != nil {
			t.Fatal(err)
		}
		r, err := Read(root)
		if err != nil {
			t.Fatal(err)
		}
		m, err := r.Build(Options{Version: "0+dev.1", CommitHash: "test", Tarball: tb})
		if err != nil {
			t.Fatal(err)
		}
		manifests = append(manifests, m)
	}
	a, _ := digestFile(tarballs[0])
	b, _ := digestFile(tarballs[1])
	if a != b {
		t.Errorf("two builds of one commit differ: %s vs %s\n%+v\n%+v", a, b, manifests[0], manifests[1])
	}

	rel := filepath.Join(work, "release")
	untgz(t, tarballs[0], rel)
	var mf Manifest
	readYAMLT(t, filepath.Join(rel, "release.MF"), &mf)
	vcap := filepath.Join(work, "vcap")
	installed := map[string]bool{}
	for _, p := range mf.Packages { // dependency order
		for _, d := range p.Dependencies {
			if !installed[d] {
				t.Fatalf("package %s comes before its dependency %s in release.MF", p.Name, d)
			}
		}
		compilePackage(t, rel, vcap, p)
		installed[p.Name] = true
	}
	cpiProps := map[string]any{"runway": map[string]any{"driver": "local", "state_dir": filepath.Join(vcap, "data", "runway_cpi"),
		"local": map[string]any{"stop_grace_seconds": 1}}}
	installJob(t, rel, vcap, "runway_cpi", cpiProps)

	cpi := &installedCPI{t: t, wrapper: filepath.Join(vcap, "jobs", "runway_cpi", "bin", "cpi")}
	t.Run("the installed bin/cpi runs a lifecycle", func(t *testing.T) { cpi.t = t; cpi.lifecycle(work) })
	t.Run("the wrapper honours BOSH_PACKAGES_DIR and BOSH_JOBS_DIR", func(t *testing.T) {
		// bosh create-env's way: the wrapper is run from its installation
		// and told where packages and jobs are.
		moved := filepath.Join(work, "elsewhere", "cpi")
		os.MkdirAll(filepath.Dir(moved), 0o755)
		if out, err := exec.Command("cp", cpi.wrapper, moved).CombinedOutput(); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		for _, env := range [][]string{
			{"BOSH_PACKAGES_DIR=" + filepath.Join(vcap, "packages"), "BOSH_JOBS_DIR=" + filepath.Join(vcap, "jobs")},
			{},
		} {
			cmd := exec.Command(moved)
			cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, env...)
			cmd.Stdin = strings.NewReader(`{"method":"info","arguments":[],"context":{"director_uuid":"d"},"api_version":1}`)
			out, err := cmd.Output()
			answered := err == nil && strings.Contains(string(out), `"api_version":3`)
			if answered != (len(env) > 0) {
				t.Errorf("wrapper outside its job with env %v: answered=%v (%v) %s", env, answered, err, out)
			}
		}
	})
	t.Run("bosh create-env's layout on container mode: a warden-style VM, its disk kept across a recreate", func(t *testing.T) {
		createEnvLifecycle(t, rel, vcap, work)
	})
	cpi.t = t
	t.Run("the orchestrator job starts, calls the colocated CPI and stops", func(t *testing.T) {
		cpi.t = t
		orchestratorJob(t, rel, vcap, cpi, work)
	})
}

type installedCPI struct {
	t       *testing.T
	wrapper string
}

type cpiResponse struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
	Log *string `json:"log"`
}

// raw runs the installed wrapper once, as the Director does: a cleared
// environment, the request on stdin, nothing on stdout but the response.
func (c *installedCPI) raw(method string, api int, args ...any) cpiResponse {
	c.t.Helper()
	if args == nil {
		args = []any{}
	}
	req, _ := json.Marshal(map[string]any{"method": method, "arguments": args, "api_version": api,
		"context": map[string]any{"director_uuid": "release-test", "vm": map[string]any{"stemcell": map[string]any{"api_version": 2}}}})
	cmd := exec.Command(c.wrapper)
	cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/nonexistent"}
	cmd.Stdin = bytes.NewReader(req)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		c.t.Fatalf("%s: installed bin/cpi exited with %v\nstdout: %s\nstderr: %s", method, err, stdout.String(), stderr.String())
	}
	var r cpiResponse
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil || r.Log == nil {
		c.t.Fatalf("%s: not a CPI response on stdout: %q (%v)", method, stdout.String(), err)
	}
	return r
}

// call asks info first (bosh-cli's order: api_version 1, then caps the
// answer at 2), then runs method at that version and expects success.
func (c *installedCPI) call(method string, args ...any) json.RawMessage {
	c.t.Helper()
	var info struct {
		APIVersion int `json:"api_version"`
	}
	r := c.raw("info", 1)
	if r.Error != nil || json.Unmarshal(r.Result, &info) != nil || info.APIVersion < 2 {
		c.t.Fatalf("info before %s: %s (error %+v); bosh-cli needs api_version >= 2", method, r.Result, r.Error)
	}
	r = c.raw(method, min(info.APIVersion, 2), args...)
	if r.Error != nil {
		c.t.Fatalf("%s: %s: %s\nlog: %s", method, r.Error.Type, r.Error.Message, *r.Log)
	}
	return r.Result
}

func (c *installedCPI) lifecycle(work string) {
	image := realinputs.StemcellImage(c.t, []byte("ok"))
	var stemcell, vm, disk, snap string
	var created []json.RawMessage
	decode(c.t, c.call("create_stemcell", image, map[string]any{}), &stemcell)
	decode(c.t, c.call("create_vm", "agent-release", stemcell, map[string]any{"command": "sleep 60"},
		map[string]any{"default": map[string]any{"type": "dynamic", "default": []string{"dns", "gateway"}}}, []string{}, map[string]any{}), &created)
	decode(c.t, created[0], &vm)
	var has bool
	decode(c.t, c.call("has_vm", vm), &has)
	if !has {
		c.t.Fatalf("has_vm %s: false right after create_vm", vm)
	}
	c.call("set_vm_metadata", vm, map[string]any{"director": "release-test", "deployment": "d", "job": "j", "index": "0"})
	decode(c.t, c.call("create_disk", 64, map[string]any{}, vm), &disk)
	if hint := c.call("attach_disk", vm, disk); len(hint) == 0 || string(hint) == "null" {
		c.t.Fatalf("attach_disk: empty hint")
	}
	var disks []string
	decode(c.t, c.call("get_disks", vm), &disks)
	if len(disks) != 1 || disks[0] != disk {
		c.t.Fatalf("get_disks: %v", disks)
	}
	decode(c.t, c.call("snapshot_disk", disk, map[string]any{}), &snap)
	c.call("delete_snapshot", snap)
	c.call("reboot_vm", vm)
	c.call("detach_disk", vm, disk)
	c.call("resize_disk", disk, 128)
	c.call("delete_disk", disk)
	c.call("delete_vm", vm)
	decode(c.t, c.call("has_vm", vm), &has)
	if has {
		c.t.Fatalf("has_vm %s: true after delete_vm", vm)
	}
	if r := c.raw("delete_vm", 2, vm); r.Error == nil || r.Error.Type != "Bosh::Clouds::VMNotFound" {
		c.t.Fatalf("delete_vm of a deleted VM: %+v; want VMNotFound", r.Error)
	}
	c.call("delete_stemcell", stemcell)
}

func orchestratorJob(t *testing.T, rel, vcap string, cpi *installedCPI, work string) {
	const token = "release-test-token"
	gitea := forgetest.NewGitea(token)
	defer gitea.Close()
	image := realinputs.StemcellImage(t, []byte("ok"))
	state := filepath.Join(vcap, "store", "runway_orchestrator")
	installJob(t, rel, vcap, "runway_orchestrator", map[string]any{"runway_orchestrator": map[string]any{
		"listen": "127.0.0.1:0", "state_dir": state, "sweep_interval": "1s",
		"cpi":    map[string]any{"path": cpi.wrapper, "director_uuid": "release-orchestrator", "timeout": "60s"},
		"forges": []any{map[string]any{"name": "gitea", "type": "gitea", "url": gitea.URL, "token": token, "poll_interval": "1s"}},
		"groups": []any{map[string]any{"name": "rel", "scope": "global", "labels": []string{"linux"}, "max_active_runners": 1,
			"stemcell": map[string]any{"image": image}, "runner": map[string]any{"command": "/bin/sleep", "args": []string{"120"}}}},
	}})
	secrets, err := os.ReadFile(filepath.Join(vcap, "jobs", "runway_orchestrator", "config", "secrets.env"))
	if err != nil || !strings.Contains(string(secrets), token) {
		t.Fatalf("secrets.env: %v\n%s", err, secrets)
	}
	if cfg, _ := os.ReadFile(filepath.Join(vcap, "jobs", "runway_orchestrator", "config", "runway.yml")); strings.Contains(string(cfg), token) {
		t.Fatalf("the forge token is in runway.yml:\n%s", cfg)
	}
	gitea.AddJob("acme/app", "build", []string{"linux"}, "queued")

	ctl := filepath.Join(vcap, "jobs", "runway_orchestrator", "bin", "ctl")
	run := func(arg string) {
		cmd := exec.Command(ctl, arg)
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"} // monit's
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("ctl %s: %v\n%s", arg, err, out)
		}
	}
	logs := func() string {
		b, _ := os.ReadFile(filepath.Join(vcap, "sys", "log", "runway_orchestrator", "runway_orchestrator.stderr.log"))
		return string(b)
	}
	pidfile := filepath.Join(vcap, "sys", "run", "runway_orchestrator", "runway_orchestrator.pid")
	run("start")
	stopped := false
	defer func() {
		if !stopped {
			run("stop")
		}
	}()
	pid := strings.TrimSpace(readFile(t, pidfile))
	eventually(t, 20*time.Second, "the daemon answers /healthz", logs, func() bool {
		addr, err := os.ReadFile(filepath.Join(state, "listen.addr"))
		if err != nil {
			return false
		}
		resp, err := http.Get("http://" + strings.TrimSpace(string(addr)) + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	var vms []struct {
		CID string `json:"cid"`
	}
	eventually(t, 60*time.Second, "a runner VM made through the colocated runway_cpi job", logs, func() bool {
		r := cpi.raw("list_vms", 2, map[string]string{"director": "release-orchestrator"})
		return r.Error == nil && json.Unmarshal(r.Result, &vms) == nil && len(vms) == 1
	})
	run("stop")
	stopped = true
	if _, err := os.Stat(pidfile); err == nil {
		t.Errorf("ctl stop left %s", pidfile)
	}
	if _, err := os.Stat("/proc/" + pid); err == nil {
		t.Errorf("runway serve (pid %s) still runs after ctl stop", pid)
	}
	// The runner VM outlives the daemon (a process group of its own) and
	// the installed CPI removes it.
	for _, vm := range vms {
		cpi.call("delete_vm", vm.CID)
	}
}

// compilePackage does what the BOSH agent does with a source package:
// unpack it into a compile directory and run its packaging script there
// with a cleared environment; the result is linked at packages/<name>.
func compilePackage(t *testing.T, rel, vcap string, p PackageRef) {
	t.Helper()
	src := filepath.Join(rel, "..", "compile", p.Name)
	untgz(t, filepath.Join(rel, "packages", p.Name+".tgz"), src)
	target := filepath.Join(vcap, "data", "packages", p.Name, p.Fingerprint)
	if err := os.MkdirAll(target, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-x", "packaging")
	cmd.Dir = src
	cmd.Env = []string{"PATH=/usr/bin:/bin", "BOSH_COMPILE_TARGET=" + src, "BOSH_INSTALL_TARGET=" + target,
		"BOSH_PACKAGES_DIR=" + filepath.Join(vcap, "packages"), "BOSH_PACKAGE_NAME=" + p.Name, "BOSH_PACKAGE_VERSION=" + p.Version}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("packaging %s: %v\n%s", p.Name, err, out)
	}
	link(t, target, filepath.Join(vcap, "packages", p.Name))
}

// installJob unpacks a job, renders every template its spec lists and its
// monit file with props, and links the result at jobs/<name>.
func installJob(t *testing.T, rel, vcap, name string, props map[string]any) {
	t.Helper()
	src := filepath.Join(rel, "..", "jobs-src", name)
	os.RemoveAll(src)
	untgz(t, filepath.Join(rel, "jobs", name+".tgz"), src)
	out := filepath.Join(vcap, "data", "jobs", name, "rendered")
	os.RemoveAll(out)
	renderJobDir(t, src, props, out)
	bins, _ := filepath.Glob(filepath.Join(out, "bin", "*"))
	for _, b := range bins {
		os.Chmod(b, 0o755)
	}
	link(t, out, filepath.Join(vcap, "jobs", name))
}

func renderJobDir(t *testing.T, jobDir string, props map[string]any, out string) {
	t.Helper()
	pf := filepath.Join(t.TempDir(), "props.json")
	b, _ := json.Marshal(props)
	if err := os.WriteFile(pf, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if msg, err := exec.Command("ruby", "render.rb", jobDir, pf, out).CombinedOutput(); err != nil {
		t.Fatalf("rendering %s: %v\n%s", jobDir, err, msg)
	}
}

func link(t *testing.T, target, at string) {
	t.Helper()
	os.MkdirAll(filepath.Dir(at), 0o755)
	os.Remove(at)
	if err := os.Symlink(target, at); err != nil {
		t.Fatal(err)
	}
}

func untgz(t *testing.T, tgz, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("tar", "-xzf", tgz, "-C", dir).CombinedOutput(); err != nil {
		t.Fatalf("tar -xzf %s: %v\n%s", tgz, err, out)
	}
}

func decode(t *testing.T, raw json.RawMessage, v any) {
	t.Helper()
	if err := json.Unmarshal(raw, v); err != nil {
		t.Fatalf("result %s: %v", raw, err)
	}
}

func readYAMLT(t *testing.T, path string, v any) {
	t.Helper()
	if err := readYAML(path, v); err != nil {
		t.Fatal(err)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// eventually polls ok until it holds, failing with what and details()
// after limit.
func eventually(t *testing.T, limit time.Duration, what string, details func() string, ok func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	for !ok() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out after %s waiting for %s\n%s", limit, what, details())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from %s", root)
	}
	return root
}
