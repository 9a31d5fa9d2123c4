package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/httpapi"
	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
	"github.com/runway-cpi/runway/src/testkit/forgetest/gitearunner"
)

func completed(e *env, ids ...int64) func() bool {
	return func() bool { return e.gitea.Completed(ids...) }
}

// mixedQueue starts the daemon with group linux (org acme, labels
// linux:host and x64, 5 runners) and a queue of three jobs it matches
// (a, b, c), one for windows, one blocked and one of another org; it
// returns once the three matching jobs are completed.
func (e *env) mixedQueue() (a, b, c, win, blocked, other int64) {
	e.writeConfig("300ms", e.group("linux", "scope: org\n    org: acme", []string{"linux:host", "x64"}, 5, ""))
	a = e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	b = e.gitea.AddJob("acme/app", "test", []string{"linux", "x64"}, forge.StatusQueued)
	c = e.gitea.AddJob("acme/lib", "lint", []string{"linux"}, forge.StatusQueued)
	win = e.gitea.AddJob("acme/app", "win", []string{"windows"}, forge.StatusQueued)
	blocked = e.gitea.AddJob("acme/app", "deploy", []string{"linux"}, forge.StatusWaiting)
	other = e.gitea.AddJob("elsewhere/app", "build", []string{"linux"}, forge.StatusQueued)
	e.start()
	e.eventually(60*time.Second, "the three matching jobs complete", completed(e, a, b, c))
	return
}

// oneRunnerEach reports any runner that ran two of the jobs ids; it
// returns ids.
func oneRunnerEach(e *env, ids ...int64) []int64 {
	ranBy := map[string]int64{}
	for _, id := range ids {
		j := e.gitea.Job(id)
		if prev, dup := ranBy[j.RunnerName]; dup {
			e.t.Errorf("runner %s ran jobs %d and %d", j.RunnerName, prev, id)
		}
		ranBy[j.RunnerName] = id
	}
	return ids
}

// Queued jobs get exactly one runner each; mismatched labels and blocked
// jobs get none; every VM is gone once the jobs are done.
func TestQueuedJobsGetOneRunnerEach(t *testing.T) {
	e := newEnv(t)
	a, b, c, win, blocked, other := e.mixedQueue()
	e.eventually(30*time.Second, "every runner VM is deleted", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })

	hist := e.runners(true)
	if len(hist) != 3 {
		t.Fatalf("want exactly 3 runners for 3 matching jobs, got %d: %+v", len(hist), hist)
	}
	for _, id := range oneRunnerEach(e, a, b, c) {
		if j := e.gitea.Job(id); !strings.HasPrefix(j.RunnerName, "linux-") {
			t.Errorf("job %d ran on %q, not a linux-<suffix> runner", id, j.RunnerName)
		}
	}
	for _, id := range []int64{win, other} {
		if s := e.gitea.Job(id).Status; s != forge.StatusQueued {
			t.Errorf("job %d (no group can run it) is %s", id, s)
		}
	}
	if s := e.gitea.Job(blocked).Status; s != forge.StatusWaiting {
		t.Errorf("blocked job is %s", s)
	}
	if n := len(e.gitea.Runners()); n != 0 {
		t.Errorf("%d runner registrations left at the forge", n)
	}
	// Each VM was deleted once: a runner reaped by the sweep is not also
	// a "VM no runner accounts for" (whose delete_vm answers VMNotFound).
	if line := grep(e.stderr.String(), "deleting a VM no runner accounts for"); line != "" {
		t.Errorf("a reaped runner's VM was deleted again as a stray: %s", line)
	}
	if m := grep(e.metrics(), `runway_cpi_call_errors_total{method="delete_vm"`); m != "" {
		t.Errorf("delete_vm failed: %s", m)
	}

	// The blocked job becomes runnable: now it is demand.
	e.gitea.SetJobStatus(blocked, forge.StatusQueued)
	e.eventually(60*time.Second, "the unblocked job completes", completed(e, blocked))
	e.eventually(30*time.Second, "its VM is deleted", func() bool { return len(e.vms()) == 0 })
	if n := len(e.runners(true)); n != 4 {
		t.Errorf("want 4 runners after the unblocked job, got %d", n)
	}
	if s := e.gitea.Job(win).Status; s != forge.StatusQueued {
		t.Errorf("windows job is %s", s)
	}

	out, err := e.runway("status", "-config", e.cfgPath)
	if err != nil || !strings.Contains(out, "linux") || !strings.Contains(out, "org acme") {
		t.Errorf("runway status: %v\n%s", err, out)
	}
	out, err = e.runway("runners", "-all", "-config", e.cfgPath)
	if err != nil || strings.Count(out, "deleted") != 4 {
		t.Errorf("runway runners -all: %v\n%s", err, out)
	}
}

// max_active_runners holds while runners are busy; the rest of the queue is
// served as runners finish, still one runner per job.
func TestMaxActiveRespected(t *testing.T) {
	e := newEnv(t)
	e.holdJobs()
	e.writeConfig("200ms", e.group("small", "scope: repo\n    repo: acme/app", []string{"linux"}, 2, ""))
	var jobs []int64
	for i := 0; i < 5; i++ {
		jobs = append(jobs, e.gitea.AddJob("acme/app", "job", []string{"linux"}, forge.StatusQueued))
	}
	e.start()
	busy := func() int {
		n := 0
		for _, id := range jobs {
			if e.gitea.Job(id).Status == forge.StatusInProgress {
				n++
			}
		}
		return n
	}
	e.eventually(30*time.Second, "two jobs in progress", func() bool { return busy() == 2 })
	// Several reconcile passes (200 ms apart) and sweeps go by: capacity holds.
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if n := len(e.vms()); n > 2 {
			t.Fatalf("%d VMs exist with max_active_runners 2", n)
		}
		if g := e.groupStatus("small"); g.ActiveRunners > 2 {
			t.Fatalf("group reports %d active runners", g.ActiveRunners)
		}
	}
	if b := busy(); b != 2 {
		t.Fatalf("%d jobs in progress with max_active_runners 2", b)
	}
	g := e.groupStatus("small")
	if g.QueuedJobs != 3 || g.Busy != 2 {
		t.Errorf("status: queued %d busy %d, want 3 and 2", g.QueuedJobs, g.Busy)
	}
	e.releaseJobs()
	e.eventually(90*time.Second, "all five jobs complete", completed(e, jobs...))
	e.eventually(30*time.Second, "no VM left", func() bool { return len(e.vms()) == 0 })
	if n := len(e.runners(true)); n != 5 {
		t.Errorf("want 5 runners for 5 jobs, got %d", n)
	}
}

// A webhook delivery starts a runner at once, although the poll interval is
// an hour; a delivery with a bad signature is refused and changes nothing.
func TestWebhookAndSignature(t *testing.T) {
	e := newEnv(t)
	e.writeConfig("1h", e.group("hooked", "scope: org\n    org: acme", []string{"linux"}, 3, ""))
	e.start()
	e.eventually(10*time.Second, "first pass done", func() bool { return !e.groupStatus("hooked").LastCheckTime.IsZero() })
	e.gitea.AddHook("http://"+e.addr+"/webhooks/gitea", []byte(webhookSecret))

	// Forged: a queued job the forge never had, signed with the wrong key.
	forged := []byte(`{"action":"queued","workflow_job":{"id":999999,"labels":["linux"],"status":"queued"},"repository":{"full_name":"acme/app"}}`)
	req, _ := http.NewRequest("POST", "http://"+e.addr+"/webhooks/gitea", bytes.NewReader(forged))
	req.Header.Set("X-Gitea-Event", "workflow_job")
	req.Header.Set("X-Gitea-Signature", forge.Sign([]byte("wrong"), forged))
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("bad signature answered %d, want 401", resp.StatusCode)
	}
	if n := len(e.runners(true)); n != 0 {
		t.Fatalf("a forged delivery made %d runners", n)
	}
	if !strings.Contains(e.stderr.String(), "bad signature") {
		t.Errorf("the rejection is not logged")
	}

	start := time.Now()
	id := e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	e.eventually(10*time.Second, "a runner for the webhook's job", func() bool { return len(e.runners(true)) == 1 })
	t.Logf("webhook → runner recorded in %s", time.Since(start).Round(time.Millisecond))
	e.eventually(60*time.Second, "the job completes", completed(e, id))
	e.eventually(30*time.Second, "its VM is deleted", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	if n := len(e.runners(true)); n != 1 {
		t.Errorf("want 1 runner, got %d", n)
	}
	// The numbers users watch: one job queued, one runner started, one
	// job run, in the histograms and on the status page.
	m := e.metrics()
	for _, name := range []string{"runway_job_queue_seconds", "runway_runner_startup_seconds", "runway_job_run_seconds"} {
		if want := name + `_count{group="hooked"} 1`; !strings.Contains(m, want) {
			t.Errorf("metrics lack %q:\n%s", want, grep(m, name+"_count"))
		}
	}
	resp, err = http.Get("http://" + e.addr + "/")
	must(t, err)
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, kind := range []string{"job queue", "runner start-up", "job run"} {
		if want := `data-kind="` + kind + `"><td>` + kind + `</td><td class="count">1</td>`; !strings.Contains(string(page), want) {
			t.Errorf("the status page lacks %q", want)
		}
	}
}

// A job queued while the last runner finishes its job gets a runner in the
// same pass that reaps the finished one: demand is counted after the
// removals. (It used to count the finished runner as supply, reap it,
// and leave the new job for the next poll, a whole interval later.)
func TestDemandAfterRemovals(t *testing.T) {
	e := newEnv(t)
	// One pass per poll, each with a fresh listing (as with the defaults:
	// 15 s polls, 30 s sweeps).
	const poll = 3 * time.Second
	e.sweep = poll.String()
	e.writeConfig(poll.String(), e.group("linux", "scope: org\n    org: acme", []string{"linux"}, 1, ""))
	e.start()
	// A pass may fall between A finishing and B being queued (a window
	// of milliseconds in 3 s): that round proves nothing and is repeated.
	for round := 1; round <= 3; round++ {
		e.holdJobs()
		a := e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
		e.eventually(30*time.Second, "a runner took job A", func() bool { return e.gitea.Job(a).Status == forge.StatusInProgress })
		// Between two passes: A finishes, B is queued. The daemon never
		// saw the runner busy, so it is an idle row whose job is gone.
		e.releaseJobs()
		e.eventually(10*time.Second, "job A completes", completed(e, a))
		b := e.gitea.AddJob("acme/app", "test", []string{"linux"}, forge.StatusQueued)
		queued := time.Now()
		e.eventually(30*time.Second, "job B completes", completed(e, b))
		byName := map[string]httpapi.RunnerView{}
		for _, r := range e.runners(true) {
			byName[r.Name] = r
		}
		first, ok1 := byName[e.gitea.Job(a).RunnerName]
		second, ok2 := byName[e.gitea.Job(b).RunnerName]
		if !ok1 || !ok2 || first.Name == second.Name {
			t.Fatalf("runners %+v; want one for A and another for B", byName)
		}
		if first.StateAt.Before(queued) {
			continue // reaped before B existed: inconclusive
		}
		// The first runner's deletion (its last state change) and the
		// second's creation fall in one pass, not a poll interval apart.
		if gap := second.CreatedAt.Sub(first.StateAt); gap > poll/2 {
			t.Errorf("the runner for B was made %s after the runner for A was reaped; want the same pass (poll %s)", gap, poll)
		}
		return
	}
	t.Fatal("three rounds in a row had a pass between A finishing and B being queued")
}

// fetchUntil polls FetchTask as a runner does until it is given a task.
func fetchUntil(e *env, r *gitearunner.Runner) string {
	var id string
	e.eventually(10*time.Second, r.Name+" is given a task", func() bool {
		var err error
		id, err = r.FetchTask()
		must(e.t, err)
		return id != ""
	})
	return id
}

// A runner made for job A whose job another runner took, and which then
// runs and finishes job B between two passes, stops counting at once: a
// job queued next gets a runner within a poll or two, not after the sweep
// (an hour here) or the runner's idle timeout. Polling only, no webhook.
func TestFinishedRunnerStopsCounting(t *testing.T) {
	e := newEnv(t)
	gate := filepath.Join(e.dir, "gate")
	wrapper := e.gatedCPI(gate, filepath.Join(e.dir, "entered"))
	const poll = time.Second
	e.sweep = "1h"
	e.writeConfig(poll.String(), e.group("linux", "scope: org\n    org: acme", []string{"linux"}, 1,
		cpiAt(wrapper)))
	// A runner of the operator's own, registered at the same scope.
	static, err := gitearunner.Register(e.gitea.URL, e.gitea.RegistrationToken("/orgs/acme"), "static-1", []string{"linux"}, false)
	must(t, err)
	e.start()
	for round := 1; round <= 3; round++ {
		must(t, os.WriteFile(gate, nil, 0o600))
		a := e.gitea.AddJob("acme/app", "a", []string{"linux"}, forge.StatusQueued)
		e.eventually(30*time.Second, "a runner is being made for job A", func() bool {
			rs := e.runners(false)
			return len(rs) == 1 && rs[0].State == store.Spawning
		})
		if got := fetchUntil(e, static); got != fmt.Sprint(a) {
			t.Fatalf("the static runner took task %s, want job A (%d)", got, a)
		}
		b := e.gitea.AddJob("acme/app", "b", []string{"linux"}, forge.StatusQueued)
		os.Remove(gate)
		e.eventually(30*time.Second, "the made runner runs and finishes job B", completed(e, b))
		runner := e.gitea.Job(b).RunnerName
		must(t, static.Update(fmt.Sprint(a), "RESULT_SUCCESS"))
		if strings.Contains(e.stderr.String(), "runner took a job group=linux runner="+runner+" ") {
			// A pass saw it busy: the ordinary path, which proves nothing.
			e.eventually(30*time.Second, "the round's runner is gone", func() bool { return len(e.runners(false)) == 0 })
			continue
		}
		c := e.gitea.AddJob("acme/app", "c", []string{"linux"}, forge.StatusQueued)
		queued := time.Now()
		e.eventually(4*poll+5*time.Second, "job C is taken by a new runner", func() bool {
			return e.gitea.Job(c).Status != forge.StatusQueued
		})
		t.Logf("job C taken %s after it was queued (poll %s, sweep 1h)", time.Since(queued).Round(time.Millisecond), poll)
		e.eventually(30*time.Second, "job C completes", completed(e, c))
		if e.gitea.Job(c).RunnerName == runner {
			t.Fatalf("job C ran on %s, which had exited", runner)
		}
		return
	}
	t.Fatal("three rounds in a row had a pass see the runner busy")
}

// forgejoEnv is newEnv with the Forgejo contract server as the forge
// (e.gitea answers as Forgejo does): polled, no webhook.
func forgejoEnv(t *testing.T, pollInterval string) *env {
	e := newEnv(t)
	e.gitea = forgetest.NewForgejo(apiToken)
	t.Cleanup(e.gitea.Close)
	e.forgeYML = fmt.Sprintf(`
  - name: forgejo
    type: forgejo
    url: %s
    token_file: %s
    poll_interval: %s`, e.gitea.URL, filepath.Join(e.dir, "api-token"), pollInterval)
	return e
}

// Forgejo registers each runner by its REST API (ephemeral), lists jobs
// without repository names or runners, and keeps an ephemeral runner
// registered after its job: every job still gets exactly one runner, and
// nothing is left behind — neither a VM nor a registration.
func TestForgejoRunnersTakeJobs(t *testing.T) {
	e := forgejoEnv(t, "300ms")
	a, b, c, win, blocked, other := e.mixedQueue()
	e.eventually(30*time.Second, "every runner VM and registration is gone", func() bool {
		return len(e.vms()) == 0 && len(e.runners(false)) == 0 && len(e.gitea.Runners()) == 0
	})
	if n := len(e.runners(true)); n != 3 {
		t.Errorf("want exactly 3 runners for 3 matching jobs, got %d", n)
	}
	for _, id := range oneRunnerEach(e, a, b, c) {
		if j := e.gitea.Job(id); j.Conclusion != "success" {
			t.Errorf("job %d ended %q", id, j.Conclusion)
		}
	}
	for _, id := range []int64{win, other, blocked} {
		if s := e.gitea.Job(id).Status; s == forge.StatusCompleted || s == forge.StatusInProgress {
			t.Errorf("job %d (no group can run it) is %s", id, s)
		}
	}
	if r := e.gitea.RemovedWhileRunning(); len(r) != 0 {
		t.Errorf("registrations removed while running a job: %v", r)
	}
	req := e.gitea.Requests()
	if n := req["POST /api/v1/orgs/acme/actions/runners"]; n != 3 {
		t.Errorf("%d runners registered by the REST API, want 3", n)
	}
	if n := req["GET /api/v1/orgs/acme/actions/runners/registration-token"]; n != 0 {
		t.Errorf("a registration token was asked %d times: Forgejo runners are registered by the REST API", n)
	}
	// Each runner's token went to its VM's user data only.
	seen := e.stderr.String() + e.metrics()
	var status strings.Builder
	for _, r := range e.runners(true) {
		fmt.Fprintf(&status, "%+v\n", r)
	}
	for _, tok := range e.gitea.IssuedTokens() {
		if strings.Contains(seen, tok) || strings.Contains(status.String(), tok) {
			t.Errorf("a Forgejo runner token appears in the daemon's log, metrics or runner API")
		}
	}

	// The blocked job becomes runnable: now it is demand.
	e.gitea.SetJobStatus(blocked, forge.StatusQueued)
	e.eventually(60*time.Second, "the unblocked job completes", completed(e, blocked))
	e.eventually(30*time.Second, "its runner is gone at the forge too", func() bool { return len(e.gitea.Runners()) == 0 })
}

// heldJobPastIdle starts the daemon (passes every poll, sweeps every
// 300 ms) with group linux (org acme, maxActive runners, an idle timeout
// of 1 s) and a job that a runner takes and holds; it returns the job,
// once in progress.
func (e *env) heldJobPastIdle(poll string, maxActive int) int64 {
	e.holdJobs()
	e.timeouts = "{spawn: 2m, idle: 1s, max_lifetime: 10m}"
	e.sweep = "300ms"
	e.writeConfig(poll, e.group("linux", "scope: org\n    org: acme", []string{"linux"}, maxActive, ""))
	job := e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	e.start()
	e.eventually(30*time.Second, "the job in progress", func() bool { return e.gitea.Job(job).Status == forge.StatusInProgress })
	return job
}

// The daemon's listing is an hour old, so the runner that took the job
// looks idle to it, and its idle timeout (1 s) passes: the runner is
// kept, because the forge shows it running a job, and the job ends well.
func TestIdleReapSparesARunnerThatTookAJob(t *testing.T) {
	e := newEnv(t)
	job := e.heldJobPastIdle("1h", 2)
	ranBy := func() (r httpapi.RunnerView) {
		for _, x := range e.runners(true) {
			if x.Name == e.gitea.Job(job).RunnerName {
				r = x
			}
		}
		return r
	}
	// Either the idle reap is refused, or (the bug) the runner goes.
	e.eventually(30*time.Second, "the idle reap is decided", func() bool {
		return strings.Contains(e.stderr.String(), "kept a runner about to be retired") || ranBy().State != store.Idle
	})
	if r := ranBy(); r.State != store.Idle || len(e.gitea.RemovedWhileRunning()) != 0 {
		t.Fatalf("the runner running the job was retired: %+v; registrations removed while running: %v", r, e.gitea.RemovedWhileRunning())
	}
	e.releaseJobs()
	e.eventually(60*time.Second, "the job completes", completed(e, job))
	e.eventually(30*time.Second, "its VM is deleted", func() bool { return len(e.vms()) == 0 })
	if j := e.gitea.Job(job); j.Conclusion != "success" {
		t.Errorf("job ended %q", j.Conclusion)
	}
	if r := e.gitea.RemovedWhileRunning(); len(r) != 0 {
		t.Errorf("registrations removed while running a job: %v", r)
	}
	// The runner that ran it was deleted only after the job ended. (The
	// hour-old listing still shows the job queued, so more runners come
	// and idle out: that is the listing's age, not a second runner.)
	j := e.gitea.Job(job)
	for _, r := range e.runners(true) {
		if r.Name == j.RunnerName && r.StateAt.Before(j.Completed) {
			t.Errorf("%s deleted at %v, before its job ended at %v", r.Name, r.StateAt, j.Completed)
		}
	}
}

// Scale-down safety while jobs are queued and finished continuously: a
// warm pool of one whose runners idle out every second, runners that
// never register (reaped after their boot timeout, never before), and a
// stream of jobs. No registration is removed under a running job, no
// runner is reaped for idling before it was online, every job succeeds.
func TestScaleDownSafetyUnderAStreamOfJobs(t *testing.T) {
	e := newEnv(t)
	e.timeouts = "{spawn: 4s, idle: 1s, max_lifetime: 10m}"
	e.sweep = "300ms"
	e.writeConfig("300ms", e.group("linux", "scope: org\n    org: acme", []string{"linux"}, 4, "    min_idle: 1\n"))
	must(t, os.WriteFile(e.stall, nil, 0o600))
	var jobs []int64
	for range 2 {
		jobs = append(jobs, e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued))
	}
	e.start()
	e.gitea.AddHook("http://"+e.addr+"/webhooks/gitea", []byte(webhookSecret))

	neverRegistered := func() []httpapi.RunnerView {
		var out []httpapi.RunnerView
		for _, r := range e.runners(true) {
			if r.Reason == "spawn timeout: never registered" && r.State == store.Deleted {
				out = append(out, r)
			}
		}
		return out
	}
	e.eventually(60*time.Second, "two runners that never registered are reaped", func() bool { return len(neverRegistered()) >= 2 })
	must(t, os.Remove(e.stall))
	for range 30 {
		jobs = append(jobs, e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued))
		// A job every quarter second: the stream, not a burst.
		<-time.After(250 * time.Millisecond)
	}
	e.eventually(180*time.Second, "every job completes", completed(e, jobs...))

	for _, id := range jobs {
		if j := e.gitea.Job(id); j.Conclusion != "success" {
			t.Errorf("job %d ended %q", id, j.Conclusion)
		}
	}
	if r := e.gitea.RemovedWhileRunning(); len(r) != 0 {
		t.Errorf("registrations removed while running a job: %v", r)
	}
	for _, r := range neverRegistered() {
		if age := r.StateAt.Sub(r.CreatedAt); age < 4*time.Second {
			t.Errorf("%s reaped as never registered %v after its spawn (boot timeout 4 s)", r.Name, age)
		}
		if r.JobID != 0 {
			t.Errorf("%s reaped as never registered ran job %d", r.Name, r.JobID)
		}
	}
	idledOut := func() (n int) {
		for _, r := range e.runners(true) {
			if r.Reason == "idle timeout" && r.State == store.Deleted {
				n++
			}
		}
		return n
	}
	e.eventually(30*time.Second, "a warm runner idles out", func() bool { return idledOut() > 0 })
	for _, r := range e.runners(true) {
		if r.Reason == "idle timeout" && r.OnlineAt.IsZero() {
			t.Errorf("%s reaped for idling before it was ever online", r.Name)
		}
	}
	// No VM is left that no runner accounts for.
	e.eventually(30*time.Second, "every VM belongs to a live runner", func() bool {
		live := map[string]bool{}
		for _, r := range e.runners(false) {
			live[r.VMCID] = true
		}
		for _, vm := range e.vms() {
			if !live[vm.CID] {
				return false
			}
		}
		return true
	})
}

// Forgejo names no runner on a job and cannot disable one: Runway takes
// a runner running a job for idle, and its idle timeout passes. The
// forge's runner list shows it active: it is kept until its job ends.
func TestForgejoIdleReapSparesABusyRunner(t *testing.T) {
	e := forgejoEnv(t, "300ms")
	job := e.heldJobPastIdle("", 1)
	e.eventually(30*time.Second, "the idle reap is refused", func() bool {
		return strings.Contains(e.stderr.String(), "kept a runner about to be retired")
	})
	if r := e.gitea.RemovedWhileRunning(); len(r) != 0 {
		t.Fatalf("the runner running the job was retired: %v", r)
	}
	e.releaseJobs()
	e.eventually(60*time.Second, "the job completes", completed(e, job))
	e.eventually(30*time.Second, "its VM and registration are gone", func() bool {
		return len(e.vms()) == 0 && len(e.gitea.Runners()) == 0
	})
	if j := e.gitea.Job(job); j.Conclusion != "success" {
		t.Errorf("job ended %q", j.Conclusion)
	}
	if r := e.gitea.RemovedWhileRunning(); len(r) != 0 {
		t.Errorf("registrations removed while running a job: %v", r)
	}
	for _, r := range e.runners(true) {
		if r.Name == e.gitea.Job(job).RunnerName && r.State == store.Deleted && r.StateAt.Before(e.gitea.Job(job).Completed) {
			t.Errorf("%s deleted at %v, before its job ended", r.Name, r.StateAt)
		}
	}
}
