package e2e

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/httpapi"
	"github.com/runway-cpi/runway/src/orchestrator/store"
)

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
