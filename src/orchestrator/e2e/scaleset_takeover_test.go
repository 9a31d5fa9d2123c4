package e2e

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
	"github.com/runway-cpi/runway/src/testkit/pgtest"
)

// The daemon is killed -9 while a scale set runner's create_vm has made
// the VM and not answered (the job acquired, its runner already running
// it). On restart the session it left is deleted by its recorded id and
// a new one opened; the interrupted spawn's VM is adopted; the job is
// not acquired again and gets no second runner; nothing is left.
func TestScaleSetKill9MidSpawn(t *testing.T) { scaleSetFlows(t, kill9MidSpawn) }

func kill9MidSpawn(t *testing.T, flow forgetest.ActionsFlow) {
	e, gh := scaleSetEnv(t, flow, 3, "")
	wrapper, stall, reached, made := stallingCPI(t, e)
	e.writeConfig("", e.group("ss", "scope: org\n    org: acme", []string{"runway-ss"}, 3,
		"    demand: scale_set\n"+cpiAt(wrapper)))
	e.holdJobs()
	must(t, os.WriteFile(stall, []byte("after"), 0o600))
	job := gh.AddJob("acme/app", []string{"runway-ss"})
	e.start()
	e.eventually(30*time.Second, "create_vm made the VM (and hangs)", func() bool { _, err := os.Stat(reached); return err == nil })
	e.eventually(30*time.Second, "its runner took the job", func() bool { return gh.Job(job).Status == "in_progress" })
	e.stop(true)
	e.eventually(10*time.Second, "the hung CPI call dies with its caller", func() bool { return countProcs("sleep 601") == 0 })
	os.Remove(stall)
	e.start()
	e.eventually(30*time.Second, "a new session, the dead one's deleted", func() bool {
		ss := e.groupStatus("ss").ScaleSet
		return ss != nil && ss.Session && gh.ActionsStats().SessionsOpened == 2
	})
	e.eventually(30*time.Second, "the interrupted spawn's VM adopted", func() bool {
		rs := e.runners(false)
		return len(rs) == 1 && rs[0].State != store.Spawning
	})
	e.releaseJobs()
	e.eventually(60*time.Second, "the job completes", func() bool { return gh.Job(job).Status == "completed" })
	e.eventually(30*time.Second, "no VM and no runner left", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	b, _ := os.ReadFile(made)
	st := gh.ActionsStats()
	if n := len(e.runners(true)); n != 1 || strings.Count(string(b), "made") != 1 {
		t.Errorf("%d runners, %d VMs made for one job; want one", n, strings.Count(string(b), "made"))
	}
	if st.Conflicts != 1 || st.AcquiredTwice != 0 || strings.Contains(e.stderr.String(), "held by another listener") {
		t.Errorf("server %+v: want the one conflict of the dead session, resolved by deleting it", st)
	}
}

// Two replicas on one PostgreSQL store: only the acting one listens.
// Four times it is killed -9 mid-spawn (before and after create_vm made
// the VM); the other takes over the group, deletes the dead listener's
// session and opens its own; every job gets exactly one runner and no VM
// is left; the standby never opens a session.
func TestScaleSetReplicasTakeOver(t *testing.T) { scaleSetFlows(t, replicasTakeOver) }

func replicasTakeOver(t *testing.T, flow forgetest.ActionsFlow) {
	dsn := pgtest.Database(t)
	e, gh := scaleSetEnv(t, flow, 10, "")
	e.usePostgres(dsn)
	wrapper, stall, reached, made := stallingCPI(t, e)
	const poll = 500 * time.Millisecond
	e.writeConfig("", e.group("ss", "scope: org\n    org: acme", []string{"runway-ss"}, 10,
		"    demand: scale_set\n    poll_interval: "+poll.String()+"\n"+cpiAt(wrapper)))
	e.holdJobs()
	rs := e.replicas(2)
	for _, r := range rs {
		r.start(e)
	}
	acting := func(what string) *replica {
		var who *replica
		e.eventually(30*time.Second, what, func() bool {
			who = nil
			n := 0
			for _, r := range rs {
				if ok, _ := r.acting(e, "ss"); ok {
					who, n = r, n+1
				}
			}
			if n > 1 {
				t.Fatalf("%d replicas act for the group at once", n)
			}
			return n == 1
		})
		return who
	}
	const trials = 4
	var jobs []int64
	for i := range trials {
		mode := []string{"before", "after"}[i%2]
		os.Remove(reached)
		must(t, os.WriteFile(stall, []byte(mode), 0o600))
		job := gh.AddJob("acme/app", []string{"runway-ss"})
		jobs = append(jobs, job)
		e.eventually(30*time.Second, fmt.Sprintf("trial %d: a create_vm stalls %s making the VM", i, mode), func() bool {
			_, err := os.Stat(reached)
			return err == nil
		})
		old := acting(fmt.Sprintf("trial %d: the acting replica", i))
		old.stop(t, syscall.SIGKILL)
		os.Remove(stall)
		next := acting(fmt.Sprintf("trial %d: the other replica takes over", i))
		old.start(e)
		e.addr = next.addr
		e.eventually(60*time.Second, fmt.Sprintf("trial %d: the job runs, no spawn left open", i), func() bool {
			if gh.Job(job).Status != "in_progress" {
				return false
			}
			for _, r := range e.runners(false) {
				if r.State == store.Spawning || r.State == store.Deleting {
					return false
				}
			}
			return true
		})
	}
	e.releaseJobs()
	e.eventually(120*time.Second, "every job completes", func() bool { return gh.Completed(jobs...) })
	e.eventually(60*time.Second, "no VM is left", func() bool { return len(e.vms()) == 0 })
	b, _ := os.ReadFile(made)
	runnerOf := map[string]int64{}
	for _, id := range jobs {
		name := gh.Job(id).RunnerName
		if prev, ok := runnerOf[name]; ok {
			t.Errorf("runner %s ran jobs %d and %d", name, prev, id)
		}
		runnerOf[name] = id
	}
	st := gh.ActionsStats()
	if n := strings.Count(string(b), "made"); n != trials {
		t.Errorf("%d VMs made for %d jobs: want one each", n, trials)
	}
	if st.SessionsOpened != trials+1 || st.AcquiredTwice != 0 {
		t.Errorf("server %+v: want %d sessions (the first, then one per takeover), nothing asked twice", st, trials+1)
	}
}
