package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

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
	e.writeConfig("", e.group("linux", "scope: org\n    org: acme", []string{"linux:host", "x64"}, 5, ""))
	a := e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	b := e.gitea.AddJob("acme/app", "test", []string{"linux", "x64"}, forge.StatusQueued)
	c := e.gitea.AddJob("acme/lib", "lint", []string{"linux"}, forge.StatusQueued)
	win := e.gitea.AddJob("acme/app", "win", []string{"windows"}, forge.StatusQueued)
	blocked := e.gitea.AddJob("acme/app", "deploy", []string{"linux"}, forge.StatusWaiting)
	other := e.gitea.AddJob("elsewhere/app", "build", []string{"linux"}, forge.StatusQueued)
	e.start()

	e.eventually(60*time.Second, "the three matching jobs complete", completed(e, a, b, c))
	e.eventually(30*time.Second, "every runner VM and registration is gone", func() bool {
		return len(e.vms()) == 0 && len(e.runners(false)) == 0 && len(e.gitea.Runners()) == 0
	})
	if n := len(e.runners(true)); n != 3 {
		t.Errorf("want exactly 3 runners for 3 matching jobs, got %d", n)
	}
	ranBy := map[string]int64{}
	for _, id := range []int64{a, b, c} {
		j := e.gitea.Job(id)
		if prev, dup := ranBy[j.RunnerName]; dup {
			t.Errorf("runner %s ran jobs %d and %d", j.RunnerName, prev, id)
		}
		ranBy[j.RunnerName] = id
		if j.Conclusion != "success" {
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

// Forgejo names no runner on a job and cannot disable one: Runway takes
// a runner running a job for idle, and its idle timeout passes. The
// forge's runner list shows it active: it is kept until its job ends.
func TestForgejoIdleReapSparesABusyRunner(t *testing.T) {
	e := forgejoEnv(t, "300ms")
	must(t, os.WriteFile(e.hold, nil, 0o600))
	e.timeouts = "{spawn: 2m, idle: 1s, max_lifetime: 10m}"
	e.sweep = "300ms"
	e.writeConfig("", e.group("linux", "scope: org\n    org: acme", []string{"linux"}, 1, ""))
	job := e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	e.start()

	e.eventually(30*time.Second, "the job in progress", func() bool { return e.gitea.Job(job).Status == forge.StatusInProgress })
	e.eventually(30*time.Second, "the idle reap is refused", func() bool {
		return strings.Contains(e.stderr.String(), "kept a runner about to be retired")
	})
	if r := e.gitea.RemovedWhileRunning(); len(r) != 0 {
		t.Fatalf("the runner running the job was retired: %v", r)
	}
	must(t, os.Remove(e.hold))
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
