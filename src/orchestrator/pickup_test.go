package orchestrator

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// An idle runner online past timeouts.pickup beside a job of the group's
// queued as long has not taken it: the plan names it and makes no more
// runners. One online for less, or a job queued for less (a runner
// polls: it takes a new job within seconds), is not.
func TestPlanRunnersNotTakingJobs(t *testing.T) {
	cfg := testGroup(5, 0)
	cfg.Timeouts.Pickup.Duration = 2 * time.Minute
	owned, jobs := queued(1, 2, 3)
	for i := range owned {
		owned[i].CreatedAt = t0.Add(-10 * time.Minute)
		jobs[owned[i].ID] = owned[i]
	}
	runner := func(online time.Time) []store.Runner {
		return []store.Runner{{Name: "g-a", State: store.Idle, TriggerJob: 1, CreatedAt: t0.Add(-time.Hour), StateAt: t0.Add(-time.Hour), OnlineAt: online}}
	}
	d := plan(cfg, t0, lst(jobs), owned, runner(t0.Add(-3*time.Minute)), nil, nil, false)
	if len(d.notTaking) != 1 || len(d.spawn) != 0 {
		t.Errorf("online 3 min beside 3 jobs queued 10 min: notTaking %v, spawn %v; want g-a and no spawn", d.notTaking, d.spawn)
	}
	if d := plan(cfg, t0, lst(jobs), owned, runner(t0.Add(-time.Minute)), nil, nil, false); len(d.notTaking) != 0 || len(d.spawn) != 2 {
		t.Errorf("online 1 min: notTaking %v, spawn %v; want none and 2 spawns", d.notTaking, d.spawn)
	}
	fresh := []forge.Job{{ID: 7, Repo: "acme/app", Status: forge.StatusQueued, Labels: []string{"linux"}, CreatedAt: t0.Add(-10 * time.Second)}}
	if d := plan(cfg, t0, lst(map[int64]forge.Job{7: fresh[0]}), fresh, runner(t0.Add(-time.Hour)), nil, nil, false); len(d.notTaking) != 0 {
		t.Errorf("a job queued 10 s ago beside a runner online an hour: notTaking %v", d.notTaking)
	}
}

// The group holds its spawns while such runners are there and for a
// hold after, doubling with each episode, reset by a runner taking a
// job; each runner is reported once, by an event and the gauge.
func TestCheckPickupHoldsAndDoubles(t *testing.T) {
	var mu sync.Mutex
	var events []RunnerEvent
	o := &Orchestrator{cfg: &config.Config{}, metrics: NewMetrics(), log: logging.Fields{Logger: logging.Discard()}, redact: &logging.Redactor{},
		events: func(e RunnerEvent) { mu.Lock(); events = append(events, e); mu.Unlock() }}
	g := &group{dep: o.deps()}
	cfg := *testGroup(5, 0)
	cfg.Labels, cfg.Timeouts.Pickup.Duration = []string{"app:host"}, time.Minute
	g.setConf(cfg)
	stuck := decision{notTaking: []store.Runner{{Name: "g-a", OnlineAt: t0}}, spawn: []int64{1}, queued: 3}
	clear := func() decision { return decision{spawn: []int64{1}} }
	d := stuck
	g.checkPickup(&d, t0)
	if d.spawn != nil || g.Status().NotTakingJobs != 1 || gauge(o, "g") != "1" {
		t.Fatalf("stuck: spawn %v, status %+v", d.spawn, g.Status())
	}
	// Gone at t0+5m: held one pickup more, then free.
	for _, c := range []struct {
		at   time.Duration
		held bool
	}{{5 * time.Minute, true}, {5*time.Minute + 59*time.Second, true}, {7 * time.Minute, false}} {
		if c.at == 5*time.Minute {
			d = stuck
			g.checkPickup(&d, t0.Add(c.at))
		}
		d = clear()
		g.checkPickup(&d, t0.Add(c.at))
		if (d.spawn == nil) != c.held {
			t.Errorf("t0+%s: spawn %v, want held %v", c.at, d.spawn, c.held)
		}
	}
	// Again: two minutes of hold; then a runner takes a job: none.
	d = stuck
	g.checkPickup(&d, t0.Add(10*time.Minute))
	d = clear()
	if g.checkPickup(&d, t0.Add(11*time.Minute+59*time.Second)); d.spawn != nil {
		t.Error("the second episode's hold is not doubled")
	}
	d = clear()
	d.busy = map[string]forge.Job{"g-b": {ID: 4}}
	if g.checkPickup(&d, t0.Add(11*time.Minute+59*time.Second)); d.spawn == nil {
		t.Error("a runner took a job: still held")
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 1 || events[0].Type != RunnerNotTaking || !strings.Contains(events[0].Message, "labels app") {
		t.Errorf("events %+v: want one not_taking naming the labels", events)
	}
}

// Runners whose program registers other names than the group's labels
// (an image whose runner is configured apart, a forge that renames):
// they come online and take none of the jobs; the group reports it
// (status, event, gauge) and makes no further runner while they are
// there.
func TestRunnersThatTakeNoJobAreReported(t *testing.T) {
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	cpi := &vmCPI{vms: map[string]map[string]any{}, giteaURL: srv.URL, registerAs: []string{"something-else"}}
	var mu sync.Mutex
	events := map[string]int{}
	o, _ := startOnGitea(t, srv.URL, "sweep_interval: 100ms", `
  - {name: infra, scope: org, org: acme, labels: [app], max_active_runners: 2, stemcell: {cid: sc-1}, runner: {command: /bin/true},
     timeouts: {pickup: 300ms}}`, cpi, func(e RunnerEvent) {
		mu.Lock()
		events[e.Type]++
		mu.Unlock()
	})
	for range 4 {
		srv.AddJob("acme/app", "build", []string{"app"}, "queued")
	}
	eventually(t, 15*time.Second, "both runners reported not taking jobs", func() bool {
		s, _ := statusOf(o, "infra")
		return s.NotTakingJobs == 2 && !s.SpawnsHeldUntil.IsZero()
	})
	mu.Lock()
	n := events[RunnerNotTaking]
	mu.Unlock()
	if n != 2 || gauge(o, "infra") != "2" {
		t.Errorf("%d not_taking events, gauge %v; want 2 and 2", n, gauge(o, "infra"))
	}
	if made := cpi.made(); made != 2 {
		t.Errorf("%d runners made for 4 jobs with max 2; want 2, and none while they take nothing", made)
	}
}

// gauge reads runway_runners_not_taking_jobs{group} as /metrics shows it.
func gauge(o *Orchestrator, group string) string {
	fams, _ := o.metrics.Registry.Gather()
	for _, f := range fams {
		if f.GetName() != "runway_runners_not_taking_jobs" {
			continue
		}
		for _, m := range f.GetMetric() {
			if m.GetLabel()[0].GetValue() == group {
				return fmt.Sprint(m.GetGauge().GetValue())
			}
		}
	}
	return ""
}
