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
)

// writeScript writes an executable shell script.
func writeScript(t testing.TB, path, body string) {
	must(t, os.WriteFile(path, []byte("#!/bin/sh\n"+body), 0o755))
}

// countProcs counts live processes whose command line contains pattern.
func countProcs(pattern string) int {
	n := 0
	dirs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, f := range dirs {
		b, err := os.ReadFile(f)
		if err != nil || len(b) == 0 {
			continue // gone, or a zombie
		}
		if strings.Contains(strings.ReplaceAll(string(b), "\x00", " "), pattern) {
			n++
		}
	}
	return n
}

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

// stallingCPI writes a bin/cpi wrapper: while the stall file says
// "before", a create_vm hangs before making the VM; "after", it makes it
// and hangs before answering (reached: touched when one hangs; made: a
// line per VM made).
func stallingCPI(t *testing.T, e *env) (wrapper, stall, reached, made string) {
	stall, reached, made = filepath.Join(e.dir, "stall"), filepath.Join(e.dir, "reached"), filepath.Join(e.dir, "made")
	wrapper = filepath.Join(e.dir, "stalling-cpi")
	writeScript(t, wrapper, fmt.Sprintf(`req=$(cat)
case "$req" in *'"create_vm"'*)
  mode=$(cat %[1]q 2>/dev/null)
  if [ "$mode" = before ]; then touch %[2]q; exec sleep 601; fi
  out=$(printf '%%s' "$req" | %[3]q "$@")
  case "$out" in *'"error":null'*) echo made >> %[4]q;; esac
  if [ "$mode" = after ]; then touch %[2]q; exec sleep 601; fi
  printf '%%s' "$out"
  exit 0;;
esac
printf '%%s' "$req" | exec %[3]q "$@"
`, stall, reached, bins.cpi, made))
	return wrapper, stall, reached, made
}

// The daemon is killed -9 while create_vm has made the VM but not answered.
// On restart the intent row leads to the VM, which is adopted (its runner
// already holds the job): no second runner, no orphan.
func TestKill9MidSpawn(t *testing.T) {
	e := newEnv(t)
	e.holdJobs()
	wrapper, stall, created, _ := stallingCPI(t, e)
	must(t, os.WriteFile(stall, []byte("after"), 0o600))
	e.writeConfig("200ms", e.group("crashy", "scope: org\n    org: acme", []string{"linux"}, 3,
		cpiAt(wrapper)))
	job := e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	e.start()
	e.eventually(30*time.Second, "create_vm made the VM (and hangs)", func() bool { _, err := os.Stat(created); return err == nil })
	e.eventually(30*time.Second, "the VM's runner took the job", func() bool { return e.gitea.Job(job).Status == forge.StatusInProgress })
	rs := e.runners(false)
	if len(rs) != 1 || rs[0].State != store.Spawning {
		t.Fatalf("before the kill: want one spawning runner, got %+v", rs)
	}
	e.stop(true)
	e.eventually(10*time.Second, "the hung CPI call dies with its caller", func() bool { return countProcs("sleep 601") == 0 })
	os.Remove(stall)
	e.start()
	e.eventually(30*time.Second, "the interrupted spawn's VM is adopted and busy", func() bool {
		rs := e.runners(false)
		return len(rs) == 1 && rs[0].State == store.Busy && rs[0].JobID == job
	})
	if n := len(e.vms()); n != 1 {
		t.Fatalf("%d VMs after recovery, want 1", n)
	}
	e.releaseJobs()
	e.eventually(60*time.Second, "the job completes", completed(e, job))
	e.eventually(30*time.Second, "no VM and no runner left", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	if n := len(e.runners(true)); n != 1 {
		t.Errorf("want exactly 1 runner ever, got %d", n)
	}
}

// A CPI that hangs is killed at the timeout; its group backs off while
// another group keeps serving its jobs.
func TestHangingCPIIsolated(t *testing.T) {
	e := newEnv(t)
	hang := filepath.Join(e.dir, "hanging-cpi")
	writeScript(t, hang, "exec sleep 602\n")
	stuck := fmt.Sprintf(`
  - name: stuck
    scope: org
    org: acme
    labels: [gpu]
    max_active_runners: 2
    stemcell: {cid: sc-anything}
    runner: {command: /bin/true}
    cpi: {path: %q, timeout: 1s}
`, hang)
	e.writeConfig("200ms", stuck, e.group("fine", "scope: org\n    org: acme", []string{"linux"}, 2, ""))
	gpu := e.gitea.AddJob("acme/app", "train", []string{"gpu"}, forge.StatusQueued)
	var linux []int64
	for i := 0; i < 3; i++ {
		linux = append(linux, e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued))
	}
	e.start()
	e.eventually(60*time.Second, "the healthy group's jobs complete", completed(e, linux...))
	e.eventually(30*time.Second, "the stuck group reports the killed call and backs off", func() bool {
		g := e.groupStatus("stuck")
		return strings.Contains(g.LastError, "deadline") && !g.BackoffUntil.IsZero()
	})
	// The group may back off on a timed-out list_vms before its
	// background create_vm is killed: wait for that call's metric.
	killedCreate := `runway_cpi_call_errors_total{method="create_vm",type="transport"}`
	e.eventually(30*time.Second, "the killed create_vm is counted", func() bool { return strings.Contains(e.metrics(), killedCreate) })
	g := e.groupStatus("stuck")
	if g.ActiveRunners > 2 {
		t.Errorf("stuck group has %d runners with max 2", g.ActiveRunners)
	}
	if s := e.gitea.Job(gpu).Status; s != forge.StatusQueued {
		t.Errorf("gpu job is %s", s)
	}
	if n := countProcs("sleep 602"); n > 2 {
		t.Errorf("%d hung CPI processes alive: timed-out calls are not killed", n)
	}
	e.stop(false)
	e.eventually(10*time.Second, "no hung CPI outlives the daemon", func() bool { return countProcs("sleep 602") == 0 })
}

// While the forge is down nothing is deleted on the strength of a listing
// that could not be read; when it returns, work resumes.
func TestForgeDownDeletesNothing(t *testing.T) {
	e := newEnv(t)
	e.holdJobs()
	e.writeConfig("200ms", e.group("steady", "scope: repo\n    repo: acme/app", []string{"linux"}, 2, ""))
	job := e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	e.start()
	e.eventually(30*time.Second, "the runner is busy", func() bool {
		rs := e.runners(false)
		return len(rs) == 1 && rs[0].State == store.Busy
	})
	before := e.runners(false)[0]
	listing := "GET /api/v1/repos/acme/app/actions/jobs"
	seen := e.gitea.Requests()[listing]
	e.gitea.SetDown(true)
	e.eventually(30*time.Second, "several passes meet the outage", func() bool {
		return e.gitea.Requests()[listing] >= seen+3 && strings.Contains(e.groupStatus("steady").LastError, "503")
	})
	rs := e.runners(false)
	if len(rs) != 1 || rs[0].Name != before.Name || rs[0].State != store.Busy {
		t.Fatalf("during the outage the runner changed: %+v", rs)
	}
	if vms := e.vms(); len(vms) != 1 || vms[0].CID != before.VMCID {
		t.Fatalf("during the outage the VMs changed: %+v", vms)
	}
	e.gitea.SetDown(false)
	e.releaseJobs()
	e.eventually(60*time.Second, "the job completes", completed(e, job))
	e.eventually(60*time.Second, "the runner is cleaned up", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
}

// min_idle keeps a warm runner; drain removes it and stops spawning;
// resume brings it back. Through the CLI.
func TestWarmPoolDrainResume(t *testing.T) {
	e := newEnv(t)
	e.writeConfig("200ms", e.group("warm", "scope: org\n    org: acme", []string{"linux"}, 2, "    min_idle: 1\n"))
	e.start()
	e.eventually(30*time.Second, "one warm runner", func() bool {
		rs := e.runners(false)
		return len(rs) == 1 && rs[0].State == store.Idle && len(e.vms()) == 1
	})
	out, err := e.runway("drain", "-config", e.cfgPath, "warm")
	if err != nil || !strings.Contains(out, "drained=true") {
		t.Fatalf("runway drain: %v\n%s", err, out)
	}
	e.eventually(30*time.Second, "the idle runner is removed", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	job := e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	added := time.Now()
	e.eventually(5*time.Second, "a pass after the job was queued", func() bool { return e.groupStatus("warm").LastCheckTime.After(added) })
	if rs := e.runners(false); len(rs) != 0 {
		t.Fatalf("a drained group spawned: %+v", rs)
	}
	// Drained across a restart, too.
	e.stop(false)
	e.start()
	e.eventually(5*time.Second, "a pass after restart", func() bool { return !e.groupStatus("warm").LastCheckTime.IsZero() })
	if !e.groupStatus("warm").Drained || len(e.runners(false)) != 0 {
		t.Fatalf("drain did not survive a restart: %+v", e.groupStatus("warm"))
	}
	// Flags after the group name are read too (they used to be ignored).
	out, err = e.runway("resume", "warm", "-config", e.cfgPath)
	if err != nil || !strings.Contains(out, "drained=false") {
		t.Fatalf("runway resume: %v\n%s", err, out)
	}
	e.eventually(60*time.Second, "the job runs after resume", completed(e, job))
	e.eventually(30*time.Second, "the warm pool is back", func() bool {
		rs := e.runners(false)
		return len(rs) == 1 && rs[0].State == store.Idle
	})
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
		e.group("crashy", "scope: org\n    org: acme", []string{"linux"}, 3, cpiAt(wrapper)),
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
	e.holdJobs() // the jobs end once the new address gets deliveries
	e.start()
	started := time.Now()
	e.eventually(15*time.Second, "both jobs are taken", func() bool {
		return e.gitea.Job(interrupted).Status != forge.StatusQueued && e.gitea.Job(whileDown).Status != forge.StatusQueued
	})
	t.Logf("both jobs taken %s after the restart", time.Since(started).Round(time.Millisecond))
	e.gitea.AddHook("http://"+e.addr+"/webhooks/gitea", []byte(webhookSecret))
	e.releaseJobs()
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
