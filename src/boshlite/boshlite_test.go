// Package boshlite runs docs/bosh-lite.md with the real callers: the bosh
// CLI's create-env and a BOSH Director on the host, both driving bin/cpi
// on the local driver's container mode with the dev stemcell's real
// bosh-agent, and the same Director on the Kubernetes driver. The tools
// are built by scripts/bosh-dev from the pinned sources in
// ../shared/thirdparty; scripts/test's "real callers" phase runs it.
package boshlite

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/testkit/cpibin"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// The steps of the guide, in its order; TestGuide checks they are there.
var (
	createEnvSteps = []string{"tools", "release", "stemcell", "webapp-release", "create-env", "create-env-disk", "create-env-recreate", "delete-env"}
	directorSteps  = []string{"bridge", "director-env", "postgres", "certificates", "director", "login", "deploy", "ssh", "logs",
		"disk-type", "recreate", "cck", "delete"}
)

// The files the guide gives in full.
var guideFiles = []string{"config/final.yml", "config/blobs.yml", "jobs/webapp/spec", "jobs/webapp/monit",
	"jobs/webapp/templates/ctl.erb", "packages/webapp/spec", "packages/webapp/packaging", "src/webapp/serve",
	"manifest.yml", "disk-2048.yml", "/srv/bosh/nats.conf", "/srv/bosh/nginx.conf", "/srv/bosh/cpi.json",
	"/srv/bosh/director.yml", "cloud-config.yml", "webapp.yml", "large.yml",
	"/srv/bosh/kubernetes.json", "cpi-config.yml", "kubernetes-cloud-config.yml", "kubernetes.yml"}

func TestGuide(t *testing.T) {
	g, err := readGuide("../../docs/bosh-lite.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range append(append(append([]string{}, createEnvSteps...), directorSteps...), kubernetesSteps...) {
		if _, ok := g.steps[s]; !ok {
			t.Errorf("no step %q", s)
		}
	}
	for _, f := range guideFiles {
		if _, ok := g.files[f]; !ok {
			t.Errorf("no file %q", f)
		}
	}
	if len(g.files) != len(guideFiles) {
		t.Errorf("files: %q, want %q", g.order, guideFiles)
	}
}

// TestBoshLite: create-env with a persistent disk, the disk grown by the
// agent's own migration, --recreate, delete-env; then a Director on the
// host: upload-stemcell, a deploy compiling a package with a disk, bosh
// ssh with sudo, bosh logs, a disk type change on the Director's default
// path (a migration), recreate, cck after a VM deleted behind its back,
// delete-deployment and clean-up. After each, nothing of it is left.
func TestBoshLite(t *testing.T) {
	tools := testenv.Need(t, "scripts/bosh-dev path; scripts/test's real-callers phase sets it", "RUNWAY_BOSH_TOOLS")[0]
	// Beside TestDirectorOnKubernetes: both mostly wait (agents, the
	// Directors); nothing of one is the other's (network namespace, work
	// and state dirs, cgroups).
	t.Parallel()
	ns := fmt.Sprintf("rwbl%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	exec.Command("ip", "-n", ns, "link", "set", "lo", "up").Run()
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	r := newRun(t, tools, ns)
	repo, work, srv, cpi := r.repo, r.work, r.srv, r.cpi
	ceState, dirState := filepath.Join(work, "create-env-state"), filepath.Join(work, "director-state")
	t.Cleanup(func() {
		// What a failed step left: deleted by the CPI, as delete-env would.
		for _, state := range []string{ceState, dirState} {
			sweep(ns, cpi, state)
		}
	})

	// bosh create-env.
	r.step("tools", repo)
	r.step("release", repo)
	r.step("stemcell", repo)
	r.step("webapp-release", work)
	r.step("create-env", work)
	starts := countStarts(t, curl(t, ns, "http://10.244.0.10:8080/starts"), 1)
	store(t, ceState, 1024, "create-env")
	r.step("create-env-disk", work)
	store(t, ceState, 2048, "create-env's disk change")
	r.step("create-env-recreate", work)
	store(t, ceState, 2048, "create-env --recreate")
	countStarts(t, curl(t, ns, "http://10.244.0.10:8080/starts"), starts+2)
	r.step("delete-env", work)
	nothingLeft(t, ceState, ns, "delete-env")

	// A Director on the host.
	for _, s := range []string{"bridge", "director-env", "postgres", "certificates", "director", "login"} {
		r.step(s, work)
	}
	r.step("deploy", work)
	starts = countStarts(t, curl(t, ns, "http://10.244.0.10:8080/starts"), 1)
	store(t, dirState, 1024, "deploy")
	if out := r.step("ssh", work); !regexp.MustCompile(`(?m)stdout \| 0\r?$`).MatchString(out) {
		t.Errorf("bosh ssh: sudo -n id -u did not print 0:\n%s", out)
	}
	r.step("logs", work)
	logs, _ := filepath.Glob(filepath.Join(work, "logs", "*.tgz"))
	if len(logs) != 1 {
		t.Errorf("bosh logs: %v in %s", logs, filepath.Join(work, "logs"))
	} else if out, err := exec.Command("tar", "tzf", logs[0]).CombinedOutput(); err != nil || !strings.Contains(string(out), "webapp/webapp.log") {
		t.Errorf("bosh logs: %s holds no webapp/webapp.log (%v):\n%s", logs[0], err, out)
	}
	r.step("disk-type", work)
	kept(t, curl(t, ns, "http://10.244.0.10:8080/kept"), "the disk type change")
	store(t, dirState, 2048, "the disk type change")
	r.step("recreate", work)
	kept(t, curl(t, ns, "http://10.244.0.10:8080/kept"), "recreate")
	store(t, dirState, 2048, "recreate")
	// Behind the Director's back: its CPI deletes the VM.
	vm := onlyVM(t, dirState)
	callCPI(t, ns, cpi, filepath.Join(srv, "cpi.json"), "delete_vm", vm)
	r.step("cck", work)
	kept(t, curl(t, ns, "http://10.244.0.10:8080/kept"), "cck")
	if nu := onlyVM(t, dirState); nu == vm {
		t.Errorf("cck: the deleted VM %s is still the instance's", vm)
	}
	countStarts(t, curl(t, ns, "http://10.244.0.10:8080/starts"), starts+3)
	r.step("delete", work)
	nothingLeft(t, dirState, ns, "delete-deployment and clean-up --all")
}

// newRun makes a run of the guide: a work directory (removed at the end
// unless the test failed), the guide's files written there as the test
// places them, and a runner whose steps run in network namespace ns (the
// host's when ""). At the end it stops what the steps started.
func newRun(t *testing.T, tools, ns string) *runner {
	if os.Geteuid() != 0 {
		t.Fatal("container mode, the Director's PostgreSQL and the dev cluster's link need root")
	}
	repo, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	g, err := readGuide(filepath.Join(repo, "docs/bosh-lite.md"))
	if err != nil {
		t.Fatal(err)
	}
	cpi, err := cpibin.Path("local", "kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	// A directory others (postgres) may enter, removed at the end.
	work, err := os.MkdirTemp("", "runway-boshlite-")
	if err != nil {
		t.Fatal(err)
	}
	os.Chmod(work, 0o755)
	srv := filepath.Join(work, "srv")
	for _, d := range []string{srv, "home", "logs", "step-logs", "webapp"} {
		if !filepath.IsAbs(d) {
			d = filepath.Join(work, d)
		}
		os.MkdirAll(d, 0o755)
	}
	// On the host's network, every process of the steps in a cgroup of
	// their own: what they start (setsid) is found there, and ended.
	var cgroup string
	if ns == "" {
		cgroup = fmt.Sprintf("/sys/fs/cgroup/pids/runway-boshlite-%d", os.Getpid())
		if err := os.Mkdir(cgroup, 0o755); err != nil {
			t.Fatalf("the steps' cgroup: %v", err)
		}
	}
	t.Cleanup(func() {
		stopAll(t, ns, srv)
		if cgroup != "" {
			killCgroup(t, cgroup)
		}
		if !t.Failed() {
			os.RemoveAll(work)
		} else {
			t.Logf("kept for a look: %s", work)
		}
	})
	pw := func() string { b := make([]byte, 12); rand.Read(b); return hex.EncodeToString(b) }
	ceState, dirState := filepath.Join(work, "create-env-state"), filepath.Join(work, "director-state")
	subst := strings.NewReplacer("/path/to/bin/cpi", cpi, "/path/to/", work+"/", "/srv/bosh", srv,
		"/var/tmp/runway-bosh-lite", ceState, "/var/tmp/runway-director", dirState, "/usr/local/bin/", tools+"/bin/",
		"DIRECTOR-PASSWORD", pw(), "AGENT-PASSWORD", pw(), "ADMIN-PASSWORD", pw())
	for _, name := range g.order {
		path := subst.Replace(name)
		if !filepath.IsAbs(path) {
			if strings.HasPrefix(name, "config/") || strings.HasPrefix(name, "jobs/") || strings.HasPrefix(name, "packages/") || strings.HasPrefix(name, "src/") {
				path = filepath.Join(work, "webapp", name)
			} else {
				path = filepath.Join(work, name)
			}
		}
		os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, []byte(subst.Replace(g.files[name])), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return &runner{t: t, g: g, subst: subst, ns: ns, work: work, logs: filepath.Join(work, "step-logs"), env: baseEnv(t, work),
		repo: repo, srv: srv, cpi: cpi, cgroup: cgroup}
}

// baseEnv is what each step starts from: the machine's PATH and Go's
// caches (scripts/release builds), HOME in the work dir (the CLI's
// ~/.bosh), nothing else of the test's environment.
func baseEnv(t *testing.T, work string) []string {
	env := []string{"PATH=/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + filepath.Join(work, "home"),
		"LANG=C.UTF-8", "TMPDIR=" + os.TempDir()}
	for _, k := range []string{"GOCACHE", "GOMODCACHE", "GOPATH", "GOFLAGS", "GOTOOLCHAIN", "BOSH_THIRDPARTY", "BOSH_DEV_DIR",
		"ROOTFS_DEV_DIR", "RUNWAY_BUILD_DIR"} {
		v := os.Getenv(k)
		if v == "" && strings.HasPrefix(k, "GO") {
			out, err := exec.Command("go", "env", k).Output()
			if err != nil {
				t.Fatalf("go env %s: %v", k, err)
			}
			v = strings.TrimSpace(string(out))
		}
		if v != "" {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// A start's line; its end only: curl's output may follow bosh's last
// line, which has no newline.
var startLine = regexp.MustCompile(`(?m)\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$`)

// countStarts checks the job's starts file (webapp/starts on the disk,
// one line a start) as served: at least want lines, the data of every
// earlier start kept.
func countStarts(t *testing.T, out string, want int) int {
	t.Helper()
	n := len(startLine.FindAllString(out, -1))
	if n < want {
		t.Fatalf("webapp/starts has %d lines, want at least %d (the disk's data lost?):\n%s", n, want, tail(out, 20))
	}
	return n
}

func kept(t *testing.T, out, after string) {
	t.Helper()
	if !regexp.MustCompile(`(?m)^kept$`).MatchString(out) {
		t.Fatalf("after %s the marker written with bosh ssh is not served from the disk:\n%s", after, tail(out, 20))
	}
}

func curl(t *testing.T, ns, url string) string {
	t.Helper()
	cmd := exec.Command("curl", "-fsS", "-m", "10", url)
	if ns != "" {
		cmd = exec.Command("nsenter", "--net=/run/netns/"+ns, "--", "curl", "-fsS", "-m", "10", url)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("curl %s: %v: %s", url, err, out)
	}
	return string(out)
}

// onlyVM is the one VM in a state dir.
func onlyVM(t *testing.T, state string) string {
	t.Helper()
	entries, _ := os.ReadDir(filepath.Join(state, "vms"))
	var vms []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), ".") {
			vms = append(vms, e.Name())
		}
	}
	if len(vms) != 1 {
		t.Fatalf("VMs in %s: %v, want one", state, vms)
	}
	return vms[0]
}

// store checks /var/vcap/store in the one VM: one mount, of a file
// system of about mib MiB (ext4 keeps some for itself).
func store(t *testing.T, state string, mib int, after string) {
	t.Helper()
	vm := onlyVM(t, state)
	pid := vmPid(t, state, vm)
	mounts, err := os.ReadFile(fmt.Sprintf("/proc/%d/mounts", pid))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(mounts), " /var/vcap/store "); n != 1 {
		t.Errorf("after %s: %d mounts at /var/vcap/store in VM %s, want 1:\n%s", after, n, vm, mounts)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(fmt.Sprintf("/proc/%d/root/var/vcap/store", pid), &st); err != nil {
		t.Fatal(err)
	}
	got := int(st.Blocks * uint64(st.Bsize) >> 20)
	if got < mib*85/100 || got > mib {
		t.Errorf("after %s: /var/vcap/store in VM %s is %d MiB, want a disk of %d MiB", after, vm, got, mib)
	}
}

// vmPid is the VM's init, as the runtime started it.
func vmPid(t *testing.T, state, vm string) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, "vms", vm, "container.pid"))
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid == 0 {
		t.Fatalf("VM %s's init: %v %q", vm, err, b)
	}
	return pid
}

// callCPI sends bin/cpi one request as the Director would.
func callCPI(t *testing.T, ns, cpi, config, method string, args ...any) {
	t.Helper()
	req, _ := json.Marshal(map[string]any{"method": method, "arguments": args, "api_version": 2,
		"context": map[string]any{"director_uuid": "behind-the-directors-back"}})
	cmd := exec.Command("nsenter", "--net=/run/netns/"+ns, "--", cpi, "-configPath", config)
	cmd.Stdin = strings.NewReader(string(req))
	out, err := cmd.Output()
	if err != nil || !strings.Contains(string(out), `"error":null`) {
		t.Fatalf("%s: %v: %s", method, err, out)
	}
}

// nothingLeft: no VM, disk, stemcell, snapshot, runtime state, loop
// device, mount, veth, cgroup or process of the state dir.
func nothingLeft(t *testing.T, state, ns, after string) {
	t.Helper()
	for _, d := range []string{"vms", "disks", "stemcells", "snapshots", "runtime"} {
		if entries, _ := os.ReadDir(filepath.Join(state, d)); len(entries) > 0 {
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Errorf("after %s: %s left: %v", after, d, names)
		}
	}
	if out, _ := exec.Command("losetup", "--list", "--noheadings", "-O", "NAME,BACK-FILE").Output(); strings.Contains(string(out), state) {
		t.Errorf("after %s: loop devices left:\n%s", after, out)
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), state) {
		t.Errorf("after %s: mounts under %s left", after, state)
	}
	if out, _ := exec.Command("ip", "-n", ns, "-o", "link", "show").Output(); regexp.MustCompile(`\d+: rw[0-9a-f]{12}@`).Match(out) {
		t.Errorf("after %s: veths left:\n%s", after, out)
	}
	sum := sha256.Sum256([]byte(state))
	if cg, _ := filepath.Glob("/sys/fs/cgroup/*/runway/" + hex.EncodeToString(sum[:4]) + "-*"); len(cg) > 0 {
		t.Errorf("after %s: cgroups left: %v", after, cg)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range procs {
		if b, _ := os.ReadFile(p); strings.Contains(string(b), state) {
			t.Errorf("after %s: a process of the state dir's VMs left: %s", after, p)
		}
	}
}

// sweep deletes every VM, disk and stemcell of a state dir through bin/cpi.
func sweep(ns, cpi, state string) {
	if _, err := os.Stat(state); err != nil {
		return
	}
	config := state + ".sweep.json"
	b, _ := json.Marshal(map[string]any{"driver": "local", "state_dir": state,
		"local": map[string]any{"isolation": "container", "container": map[string]any{"bosh_agent": true}}})
	os.WriteFile(config, b, 0o600)
	for _, k := range []struct{ dir, method string }{{"vms", "delete_vm"}, {"disks", "delete_disk"}, {"stemcells", "delete_stemcell"}} {
		entries, _ := os.ReadDir(filepath.Join(state, k.dir))
		for _, e := range entries {
			req, _ := json.Marshal(map[string]any{"method": k.method, "arguments": []string{e.Name()}, "context": map[string]any{"director_uuid": "sweep"}})
			cmd := exec.Command("nsenter", "--net=/run/netns/"+ns, "--", cpi, "-configPath", config)
			cmd.Stdin = strings.NewReader(string(req))
			cmd.Run()
		}
	}
}

// killCgroup kills every process of a cgroup until none is left, and
// removes it.
func killCgroup(t *testing.T, cgroup string) {
	for i := 0; i < 100; i++ {
		b, _ := os.ReadFile(filepath.Join(cgroup, "cgroup.procs"))
		pids := strings.Fields(string(b))
		if len(pids) == 0 {
			break
		}
		for _, f := range pids {
			if pid, err := strconv.Atoi(f); err == nil {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := os.Remove(cgroup); err != nil {
		t.Errorf("processes of the steps left: %v", err)
	}
}

// stopAll ends the PostgreSQL cluster and what the steps started in
// namespace ns (the Director, its workers, NATS, nginx, a VM's
// supervisor). On the host's network (ns "") the run's cgroup does that.
func stopAll(t *testing.T, ns, srv string) {
	if _, err := os.Stat(filepath.Join(srv, "pg", "postmaster.pid")); err == nil {
		exec.Command("runuser", "-u", "postgres", "--", "/usr/lib/postgresql/15/bin/pg_ctl", "-D", filepath.Join(srv, "pg"), "-m", "fast", "-w", "stop").Run()
	}
	if ns == "" {
		return // the run's cgroup ends the rest
	}
	out, _ := exec.Command("ip", "netns", "pids", ns).Output()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
