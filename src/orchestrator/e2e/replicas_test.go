package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator"
	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/testkit/pgtest"
	"github.com/runway-cpi/runway/src/testkit/testlog"
)

// replica is one `runway serve` of several sharing a PostgreSQL store.
type replica struct {
	i      int
	cfg    string
	dir    string
	cmd    *exec.Cmd
	out    *testlog.Buffer
	exited chan struct{}
	addr   string
}

// replicas writes one config per replica (its own state_dir, the rest
// usePostgres gives the daemons the PostgreSQL store at dsn (made by
// pgtest.Database before the env, so that it is dropped after the
// daemons have stopped).
func (e *env) usePostgres(dsn string) {
	dsnFile := filepath.Join(e.dir, "pg.dsn")
	must(e.t, os.WriteFile(dsnFile, []byte(dsn+"\n"), 0o600))
	e.top = "store: postgres\npostgres:\n  dsn_file: " + dsnFile
}

// shared) from e's config.
func (e *env) replicas(n int) []*replica {
	base, err := os.ReadFile(e.cfgPath)
	must(e.t, err)
	var rs []*replica
	for i := 0; i < n; i++ {
		r := &replica{i: i, dir: filepath.Join(e.dir, fmt.Sprintf("replica-%d", i))}
		r.cfg = filepath.Join(e.dir, fmt.Sprintf("runway-%d.yml", i))
		cfg := strings.Replace(string(base), "state_dir: "+filepath.Join(e.dir, "orch"), "state_dir: "+r.dir, 1)
		must(e.t, os.WriteFile(r.cfg, []byte(cfg), 0o600))
		rs = append(rs, r)
	}
	e.t.Cleanup(func() {
		for _, r := range rs {
			r.stop(e.t, syscall.SIGTERM)
			if e.t.Failed() && r.out != nil {
				e.t.Logf("replica %d output:\n%s", r.i, strings.NewReplacer(apiToken, "<api token>", webhookSecret, "<webhook secret>").Replace(r.out.String()))
			}
		}
	})
	return rs
}

func (r *replica) start(e *env) {
	e.t.Helper()
	os.Remove(filepath.Join(r.dir, "listen.addr"))
	r.cmd = exec.Command(bins.runway, "serve", "-config", r.cfg)
	r.out = &testlog.Buffer{}
	r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
	r.cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + e.dir}, e.extraEnv...)
	must(e.t, r.cmd.Start())
	exited := make(chan struct{})
	r.exited = exited
	go func(c *exec.Cmd) { c.Wait(); close(exited) }(r.cmd)
	r.addr = e.waitHealthy(fmt.Sprintf("replica %d", r.i), r.dir, exited, r.out)
}

func (r *replica) stop(t testing.TB, sig syscall.Signal) {
	stopProcess(t, fmt.Sprintf("replica %d", r.i), r.cmd, r.exited, sig)
	r.cmd = nil
}

// acting asks a replica whether it acts for group (false when it does
// not answer).
func (r *replica) acting(e *env, group string) (bool, time.Time) {
	if r.cmd == nil {
		return false, time.Time{}
	}
	var gs []orchestrator.GroupStatus
	resp, err := http.Get("http://" + r.addr + "/api/v1/groups")
	if err != nil {
		return false, time.Time{}
	}
	defer resp.Body.Close()
	if json.NewDecoder(resp.Body).Decode(&gs) != nil {
		return false, time.Time{}
	}
	for _, g := range gs {
		if g.Name == group {
			return g.Acting, g.ActingSince
		}
	}
	return false, time.Time{}
}

// Three replicas on one PostgreSQL store against the Gitea contract
// server. Twenty times, the replica acting for the group is killed -9 in
// the middle of a spawn — half the time before create_vm made the VM,
// half after it made it but before it answered — and restarted. Another
// replica takes the group over; every job gets exactly one runner; no VM
// is left once the jobs are done. Reported: takeover times.
func TestReplicasSurviveKill9MidSpawn(t *testing.T) {
	dsn := pgtest.Database(t)
	e := newEnv(t)
	e.usePostgres(dsn)
	e.holdJobs()
	// stall: "before" or "after", where create_vm stalls; reached: one is
	// stalled; made: one line per VM create_vm made.
	wrapper, stall, reached, made := stallingCPI(t, e)
	const poll = 500 * time.Millisecond
	e.writeConfig(poll.String(), e.group("ha", "scope: org\n    org: acme", []string{"linux"}, 30,
		cpiAt(wrapper)))
	rs := e.replicas(3)
	for _, r := range rs {
		r.start(e)
	}
	e.addr = rs[0].addr

	// whoActs waits for exactly one replica acting, checking on the way
	// that never two do.
	whoActs := func(what string) (*replica, time.Time) {
		t.Helper()
		var who *replica
		var since time.Time
		e.eventually(30*time.Second, what, func() bool {
			who, since = nil, time.Time{}
			n := 0
			for _, r := range rs {
				if ok, at := r.acting(e, "ha"); ok {
					who, since = r, at
					n++
				}
			}
			if n > 1 {
				t.Fatalf("%d replicas act for the group at once", n)
			}
			return n == 1
		})
		return who, since
	}
	whoActs("one replica acts for the group")

	const trials = 20
	var jobs []int64
	var takeovers []time.Duration
	for i := 0; i < trials; i++ {
		mode := "before"
		if i%2 == 1 {
			mode = "after"
		}
		os.Remove(reached)
		must(t, os.WriteFile(stall, []byte(mode), 0o600))
		job := e.gitea.AddJob("acme/app", fmt.Sprintf("build-%d", i), []string{"linux"}, forge.StatusQueued)
		jobs = append(jobs, job)
		e.eventually(30*time.Second, fmt.Sprintf("trial %d: a create_vm stalls %s making the VM", i, mode), func() bool {
			_, err := os.Stat(reached)
			return err == nil
		})
		acting, _ := whoActs(fmt.Sprintf("trial %d: the acting replica", i))
		killed := time.Now()
		acting.stop(t, syscall.SIGKILL)
		os.Remove(stall)
		next, since := whoActs(fmt.Sprintf("trial %d: another replica takes over", i))
		if next == acting {
			t.Fatalf("trial %d: the killed replica still acts", i)
		}
		takeovers = append(takeovers, since.Sub(killed))
		acting.start(e)
		e.eventually(60*time.Second, fmt.Sprintf("trial %d: the job is taken and no spawn is left open", i), func() bool {
			if e.gitea.Job(job).Status != forge.StatusInProgress {
				return false
			}
			e.addr = next.addr
			for _, r := range e.runners(false) {
				if r.State == store.Spawning || r.State == store.Deleting {
					return false
				}
			}
			return true
		})
	}

	e.releaseJobs()
	e.eventually(120*time.Second, "every job completes", completed(e, jobs...))
	e.eventually(60*time.Second, "no VM is left", func() bool { return len(e.vms()) == 0 })

	b, _ := os.ReadFile(made)
	vmsMade := strings.Count(string(b), "made")
	runnerOf := map[string]int64{}
	double := 0
	for _, id := range jobs {
		name := e.gitea.Job(id).RunnerName
		if prev, ok := runnerOf[name]; ok {
			t.Errorf("runner %s ran jobs %d and %d", name, prev, id)
		}
		runnerOf[name] = id
	}
	if vmsMade > len(jobs) {
		double = vmsMade - len(jobs)
	}
	sort.Slice(takeovers, func(a, b int) bool { return takeovers[a] < takeovers[b] })
	median, worst := takeovers[len(takeovers)/2], takeovers[len(takeovers)-1]
	leaked := len(e.vms())
	t.Logf("replicas: %d kill -9 mid-spawn; VMs made %d for %d jobs (double runners %d); leaked VMs %d; takeover median %s, max %s (poll %s)",
		trials, vmsMade, len(jobs), double, leaked, median.Round(time.Millisecond), worst.Round(time.Millisecond), poll)
	if double != 0 || vmsMade != len(jobs) {
		t.Errorf("%d VMs made for %d jobs: want exactly one each", vmsMade, len(jobs))
	}
	if worst > 2*poll {
		t.Errorf("a takeover took %s: want within 2 poll intervals (%s)", worst, 2*poll)
	}
}
