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

// The daemon is killed -9 while create_vm has made the VM but not answered.
// On restart the intent row leads to the VM, which is adopted (its runner
// already holds the job): no second runner, no orphan.
func TestKill9MidSpawn(t *testing.T) {
	e := newEnv(t)
	must(t, os.WriteFile(e.hold, nil, 0o600))
	stall := filepath.Join(e.dir, "stall")
	created := filepath.Join(e.dir, "created")
	wrapper := filepath.Join(e.dir, "stalling-cpi")
	// Passes every call to bin/cpi; while $stall exists a create_vm makes
	// the VM and then never answers.
	writeScript(t, wrapper, fmt.Sprintf(`req=$(cat)
case "$req" in *'"create_vm"'*)
  if [ -e %[1]q ]; then
    printf '%%s' "$req" | %[2]q "$@" > %[3]q.out
    touch %[3]q
    exec sleep 601
  fi;;
esac
printf '%%s' "$req" | exec %[2]q "$@"
`, stall, bins.cpi, created))
	must(t, os.WriteFile(stall, nil, 0o600))
	e.writeConfig("200ms", e.group("crashy", "scope: org\n    org: acme", []string{"linux"}, 3,
		fmt.Sprintf("    cpi: {path: %q}\n", wrapper)))
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
	os.Remove(e.hold)
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
	must(t, os.WriteFile(e.hold, nil, 0o600))
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
	os.Remove(e.hold)
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
