package e2e

// What a real Gitea 1.26 showed (issue 31): runners that finish between
// two passes, recovery after a crash, and a backoff outliving the outage.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/testkit/forgetest/gitearunner"
)

// gatedCPI writes a bin/cpi wrapper whose create_vm waits, before making
// anything, while gate exists (touching entered when it starts waiting).
func (e *env) gatedCPI(gate, entered string) string {
	wrapper := filepath.Join(e.dir, "gated-cpi")
	writeScript(e.t, wrapper, fmt.Sprintf(`req=$(cat)
case "$req" in *'"create_vm"'*)
  touch %[2]q
  while [ -e %[1]q ]; do sleep 0.05; done;;
esac
printf '%%s' "$req" | exec %[3]q "$@"
`, gate, entered, bins.cpi))
	return wrapper
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
		fmt.Sprintf("    cpi: {path: %q}\n", wrapper)))
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

// The daemon is killed -9 while create_vm has not made the VM yet, and a
// job for another group is queued while it is down (its webhook is lost).
// On restart both jobs get runners in the first passes, although polls
// and sweeps are an hour apart: the interrupted spawn's replacement comes
// in the pass that settles it (not from some other spawn's wake-up: its
// group has none), and the queue is listed at once.
func TestRestartReplacesInterruptedSpawnAtOnce(t *testing.T) {
	e := newEnv(t)
	gate, entered := filepath.Join(e.dir, "gate"), filepath.Join(e.dir, "entered")
	wrapper := e.gatedCPI(gate, entered)
	e.sweep = "1h"
	e.writeConfig("1h",
		e.group("crashy", "scope: org\n    org: acme", []string{"linux"}, 3, fmt.Sprintf("    cpi: {path: %q}\n", wrapper)),
		e.group("arm", "scope: org\n    org: acme", []string{"arm64"}, 3, ""))
	must(t, os.WriteFile(gate, nil, 0o600))
	e.start()
	e.gitea.AddHook("http://"+e.addr+"/webhooks/gitea", []byte(webhookSecret))
	interrupted := e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	e.eventually(30*time.Second, "create_vm for the job is waiting", func() bool { _, err := os.Stat(entered); return err == nil })
	e.stop(true)
	e.eventually(10*time.Second, "the waiting CPI call dies with its caller", func() bool { return countProcs(wrapper) == 0 })
	whileDown := e.gitea.AddJob("acme/app", "arm", []string{"arm64"}, forge.StatusQueued)
	e.gitea.WaitDeliveries() // lost: nobody listens
	os.Remove(gate)
	must(t, os.WriteFile(e.hold, nil, 0o600)) // the jobs end once the new address gets deliveries
	e.start()
	started := time.Now()
	e.eventually(15*time.Second, "both jobs are taken", func() bool {
		return e.gitea.Job(interrupted).Status != forge.StatusQueued && e.gitea.Job(whileDown).Status != forge.StatusQueued
	})
	t.Logf("both jobs taken %s after the restart", time.Since(started).Round(time.Millisecond))
	e.gitea.AddHook("http://"+e.addr+"/webhooks/gitea", []byte(webhookSecret))
	os.Remove(e.hold)
	e.eventually(30*time.Second, "both complete", completed(e, interrupted, whileDown))
	e.eventually(30*time.Second, "no VM and no runner left", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	if n := len(e.runners(true)); n != 3 {
		t.Errorf("want 3 runners ever (the interrupted one and two), got %d", n)
	}
}

// While the forge fails, the group backs off (2 s, 4 s, 8 s, 16 s...). A
// webhook delivery after the forge is back ends the backoff: its job gets
// a runner at once, not when the 16 s are up.
func TestWebhookEndsForgeBackoff(t *testing.T) {
	e := newEnv(t)
	e.sweep = "1h"
	e.writeConfig("1s", e.group("hooked", "scope: org\n    org: acme", []string{"linux"}, 3, ""))
	e.start()
	e.gitea.AddHook("http://"+e.addr+"/webhooks/gitea", []byte(webhookSecret))
	e.eventually(10*time.Second, "first pass done", func() bool { return !e.groupStatus("hooked").LastCheckTime.IsZero() })
	e.gitea.SetDown(true)
	e.eventually(60*time.Second, "the backoff reaches 16 s", func() bool {
		return time.Until(e.groupStatus("hooked").BackoffUntil) > 12*time.Second
	})
	e.gitea.SetDown(false)
	job := e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	queued := time.Now()
	e.eventually(6*time.Second, "the delivered job is taken", func() bool { return e.gitea.Job(job).Status != forge.StatusQueued })
	t.Logf("job taken %s after its delivery ended a 16 s backoff", time.Since(queued).Round(time.Millisecond))
	e.eventually(30*time.Second, "the job completes", completed(e, job))
	if g := e.groupStatus("hooked"); g.LastError != "" || !g.BackoffUntil.IsZero() {
		t.Errorf("after the outage: %+v", g)
	}
}
