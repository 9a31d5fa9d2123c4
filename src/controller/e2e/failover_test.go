package e2e

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// killLeaderMidSpawn queues jobs, kills the leading replica's pod (grace
// 0: SIGKILL) as their runners are being made, and checks the other
// replica takes over within 15 s and every job is run by exactly one
// runner, with no runner pod or registration left. made is how many
// runner pods were made before.
func (c *cluster) killLeaderMidSpawn(gitea *forgetest.Gitea, registrations *atomic.Int64, made int) {
	t := c.t
	regs0 := registrations.Load()
	// SIGKILL to the leader's runway process (this host runs the dev
	// cluster's containers): no goodbye, its Lease left to expire.
	ids, _ := c.signalLeaderMidSpawn(gitea, made, syscall.SIGKILL, "killed")
	c.waitFor(120*time.Second, "the four jobs completed after the failover", func() bool { return gitea.Completed(ids...) })
	c.waitFor(120*time.Second, "every runner pod gone", func() bool { return c.runnerPods() == 0 })
	// One runner per job: a runner whose pod was made before the kill is
	// adopted or deleted by the new leader, never doubled.
	regs := registrations.Load() - regs0
	if regs != 4 {
		t.Errorf("4 jobs across the failover: %d registrations, want 4 (one runner each)", regs)
	}
	for _, id := range ids {
		if j := gitea.Job(id); j.Status != "completed" {
			t.Errorf("job %d: %s", id, j.Status)
		}
	}
	c.waitFor(60*time.Second, "no registration left", func() bool { return len(gitea.Runners()) == 0 })
	t.Logf("failover: %d runner pods made for 4 jobs (a pod made before the kill and deleted by the new leader counts)", c.podsMade()-made)
}

// signalLeaderMidSpawn queues four jobs, sends sig to the leader's
// process as their runners are being made, and checks another replica
// leads within 15 s. It answers the jobs and the process.
func (c *cluster) signalLeaderMidSpawn(gitea *forgetest.Gitea, made int, sig syscall.Signal, what string) ([]int64, int) {
	t := c.t
	leader := c.leader()
	if leader == "" {
		t.Fatal("no leader")
	}
	var ids []int64
	for range 4 {
		ids = append(ids, gitea.AddJob("acme/app", "build", []string{"linux"}, "queued"))
	}
	c.waitFor(30*time.Second, "a runner pod being made", func() bool { return c.podsMade() > made })
	pod, _, _ := strings.Cut(leader, "_")
	pid := processOf(t, pod)
	at := time.Now()
	if err := syscall.Kill(pid, sig); err != nil {
		t.Fatal(err)
	}
	c.waitFor(30*time.Second, "another replica leading", func() bool { l := c.leader(); return l != "" && l != leader })
	takeover := time.Since(at)
	t.Logf("leader %s %s mid-spawn; %s took over in %s", leader, what, c.leader(), takeover.Round(10*time.Millisecond))
	if takeover > 15*time.Second {
		t.Errorf("takeover from a leader %s took %s, want at most 15 s", what, takeover)
	}
	return ids, pid
}

// processOf finds the runway controller process of a pod on this host
// (its environment names the pod).
func processOf(t testing.TB, pod string) int {
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range procs {
		env, err := os.ReadFile(p)
		if err != nil || !bytes.Contains(env, []byte("\x00POD_NAME="+pod+"\x00")) && !bytes.HasPrefix(env, []byte("POD_NAME="+pod+"\x00")) {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join(filepath.Dir(p), "cmdline"))
		if bytes.Contains(cmd, []byte("runway\x00controller")) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return pid
		}
	}
	t.Fatalf("no runway controller process of pod %s on this host", pod)
	return 0
}

// freezeLeaderMidSpawn queues jobs, freezes the leading replica's
// process (SIGSTOP: its connections stay up, its Lease is not renewed)
// as their runners are being made, and checks another replica leads
// within 15 s and every job is run by exactly one runner; then resumes
// it (SIGCONT) and queues two more jobs: two registrations, none of the
// resumed one's, which ends (its container restarts as a standby).
func (c *cluster) freezeLeaderMidSpawn(gitea *forgetest.Gitea, registrations *atomic.Int64, made int) {
	t := c.t
	regs0 := registrations.Load()
	ids, pid := c.signalLeaderMidSpawn(gitea, made, syscall.SIGSTOP, "frozen")
	resumed := false
	resume := func() {
		if !resumed {
			resumed = true
			syscall.Kill(pid, syscall.SIGCONT)
		}
	}
	defer resume()
	c.waitFor(120*time.Second, "the four jobs completed with the old leader frozen", func() bool { return gitea.Completed(ids...) })
	c.waitFor(120*time.Second, "every runner pod gone", func() bool { return c.runnerPods() == 0 })
	if regs := registrations.Load() - regs0; regs != 4 {
		t.Errorf("4 jobs across the freeze: %d registrations, want 4 (one runner each)", regs)
	}
	// Resumed: it must not act. Two jobs: two registrations, the new
	// leader's; the resumed process ends.
	regs1, made1 := registrations.Load(), c.podsMade()
	resume()
	more := []int64{gitea.AddJob("acme/app", "build", []string{"linux"}, "queued"), gitea.AddJob("acme/app", "build", []string{"linux"}, "queued")}
	c.waitFor(60*time.Second, "the resumed leader's process ended", func() bool { return syscall.Kill(pid, 0) != nil })
	c.waitFor(120*time.Second, "two more jobs completed", func() bool {
		return gitea.Job(more[0]).Status == "completed" && gitea.Job(more[1]).Status == "completed"
	})
	c.waitFor(120*time.Second, "every runner pod gone", func() bool { return c.runnerPods() == 0 })
	if regs, pods := registrations.Load()-regs1, c.podsMade()-made1; regs != 2 || pods != 2 {
		t.Errorf("2 jobs after the frozen leader resumed: %d registrations, %d runner pods; want 2 and 2", regs, pods)
	}
	c.waitFor(60*time.Second, "no registration left", func() bool { return len(gitea.Runners()) == 0 })
	t.Logf("freeze: %d runner pods made for 4 jobs; resumed, the old leader made nothing and ended", made1-made)
}
