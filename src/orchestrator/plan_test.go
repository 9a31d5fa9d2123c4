package orchestrator

import (
	"fmt"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

var t0 = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func testGroup(maxActive, minIdle int) *config.GroupConfig {
	return &config.GroupConfig{Name: "g", MaxActiveRunners: maxActive, MinIdle: minIdle, Timeouts: config.Timeouts{
		Spawn: config.Duration{Duration: 10 * time.Minute}, Idle: config.Duration{Duration: 15 * time.Minute}, MaxLifetime: config.Duration{Duration: 6 * time.Hour}}}
}

func lst(jobs map[int64]forge.Job) listing {
	l := listing{jobs: jobs, running: map[string]forge.Job{}}
	for _, j := range jobs {
		if j.Status == forge.StatusInProgress {
			l.running[j.RunnerName] = j
		}
	}
	return l
}

func queued(ids ...int64) ([]forge.Job, map[int64]forge.Job) {
	var list []forge.Job
	m := map[int64]forge.Job{}
	for _, id := range ids {
		j := forge.Job{ID: id, Repo: "acme/app", Status: forge.StatusQueued, Labels: []string{"linux"}}
		list = append(list, j)
		m[id] = j
	}
	return list, m
}

func TestPlanOneRunnerPerQueuedJob(t *testing.T) {
	owned, jobs := queued(1, 2, 3)
	d := plan(testGroup(10, 0), t0, lst(jobs), owned, nil, nil, nil, false)
	if len(d.spawn) != 3 || d.spawn[0] != 1 || d.spawn[2] != 3 {
		t.Fatalf("spawn %v", d.spawn)
	}
	// The next pass, with those runners recorded (one still spawning), adds none.
	runners := []store.Runner{
		{Name: "g-a", State: store.Spawning, TriggerJob: 1, CreatedAt: t0},
		{Name: "g-b", State: store.Idle, TriggerJob: 2, CreatedAt: t0, StateAt: t0},
		{Name: "g-c", State: store.Idle, TriggerJob: 3, CreatedAt: t0, StateAt: t0},
	}
	d = plan(testGroup(10, 0), t0.Add(time.Second), lst(jobs), owned, runners, map[string]bool{"g-a": true}, nil, false)
	if len(d.spawn) != 0 || len(d.reap) != 0 {
		t.Fatalf("second pass: spawn %v reap %v", d.spawn, d.reap)
	}
	// A fourth job with the same labels gets exactly one more.
	owned, jobs = queued(1, 2, 3, 4)
	d = plan(testGroup(10, 0), t0.Add(time.Second), lst(jobs), owned, runners, map[string]bool{"g-a": true}, nil, false)
	if len(d.spawn) != 1 || d.spawn[0] != 4 {
		t.Fatalf("fourth job: spawn %v", d.spawn)
	}
}

func TestPlanCapacityCountsEveryLiveRunner(t *testing.T) {
	owned, jobs := queued(1, 2, 3, 4, 5)
	runners := []store.Runner{
		{Name: "g-busy", State: store.Busy, JobID: 9, CreatedAt: t0},
		{Name: "g-del", State: store.Deleting, Reason: "job finished", CreatedAt: t0},
	}
	jobs[9] = forge.Job{ID: 9, Status: forge.StatusInProgress, RunnerName: "g-busy"}
	d := plan(testGroup(3, 0), t0, lst(jobs), owned, runners, nil, nil, false)
	if len(d.spawn) != 1 {
		t.Fatalf("max 3 with 2 live runners: spawn %v", d.spawn)
	}
	if d.reap["g-del"] != "job finished" {
		t.Errorf("a deleting runner's deletion is resumed: %v", d.reap)
	}
}

func TestPlanLifecycle(t *testing.T) {
	owned, jobs := queued(1)
	jobs[7] = forge.Job{ID: 7, Status: forge.StatusInProgress, RunnerName: "g-took"}
	runners := []store.Runner{
		{Name: "g-lost", State: store.Spawning, TriggerJob: 1, CreatedAt: t0},                                                        // no spawn in flight
		{Name: "g-took", State: store.Idle, TriggerJob: 1, CreatedAt: t0, StateAt: t0},                                               // took job 7
		{Name: "g-old", State: store.Idle, CreatedAt: t0.Add(-time.Hour), StateAt: t0.Add(-time.Hour), OnlineAt: t0.Add(-time.Hour)}, // idle too long
		{Name: "g-done", State: store.Busy, JobID: 8, CreatedAt: t0, StateAt: t0},                                                    // job 8 left the listing
		{Name: "g-ancient", State: store.Busy, JobID: 7, CreatedAt: t0.Add(-7 * time.Hour), StateAt: t0},                             // past max lifetime
		{Name: "g-vanish", State: store.Idle, TriggerJob: 5, CreatedAt: t0, StateAt: t0.Add(-2 * time.Minute)},                       // trigger job gone
	}
	d := plan(testGroup(10, 0), t0, lst(jobs), owned, runners, nil, nil, false)
	if len(d.recover) != 1 || d.recover[0].Name != "g-lost" {
		t.Errorf("recover %v", d.recover)
	}
	if d.busy["g-took"].ID != 7 {
		t.Errorf("busy %v", d.busy)
	}
	if d.reap["g-old"] != "idle timeout" || d.reap["g-ancient"] != "max lifetime" || len(d.reap) != 2 {
		t.Errorf("reap %v", d.reap)
	}
	names := map[string]bool{}
	for _, r := range d.confirm {
		names[r.Name] = true
	}
	if !names["g-done"] || !names["g-vanish"] || len(names) != 2 {
		t.Errorf("confirm %v", names)
	}
	if len(d.spawn) != 0 {
		t.Errorf("job 1 is covered by the runner being recovered: spawn %v", d.spawn)
	}
}

func TestPlanDrainAndWarmPool(t *testing.T) {
	_, jobs := queued()
	d := plan(testGroup(4, 2), t0, lst(jobs), nil, nil, nil, nil, false)
	if len(d.spawn) != 2 || d.spawn[0] != 0 {
		t.Fatalf("warm pool of 2: spawn %v", d.spawn)
	}
	owned, jobs := queued(1, 2, 3)
	idle := []store.Runner{{Name: "g-w", State: store.Idle, CreatedAt: t0, StateAt: t0, OnlineAt: t0}}
	d = plan(testGroup(4, 2), t0, lst(jobs), owned, idle, nil, nil, true)
	if len(d.spawn) != 0 || d.reap["g-w"] != "group drained" {
		t.Fatalf("drained: spawn %v reap %v", d.spawn, d.reap)
	}
	// Still booting: a drain waits until it is online (or its spawn
	// timeout): it may be taking a job this moment.
	idle[0].OnlineAt = time.Time{}
	if d = plan(testGroup(4, 2), t0, lst(jobs), owned, idle, nil, nil, true); len(d.reap) != 0 {
		t.Fatalf("drained, booting: reap %v", d.reap)
	}
}

// Scale-down safety in the plan: no idle-time or lifetime reap of a
// runner within its boot timeout (counted from its VM's creation, not
// from a spawn queued behind others); past it, a runner never seen
// online is reaped; idle time counts from coming online.
func TestPlanSparesBootingRunners(t *testing.T) {
	cfg := testGroup(5, 0)
	cfg.Timeouts.Idle = config.Duration{Duration: time.Second}
	cfg.Timeouts.Spawn = config.Duration{Duration: time.Minute}
	_, jobs := queued()
	booting := []store.Runner{{Name: "g-b", State: store.Idle, CreatedAt: t0.Add(-59 * time.Second), StateAt: t0.Add(-50 * time.Second)}}
	// Each step changes the runner and plans again; want is g-b's reap
	// reason ("": nothing reaped).
	for _, step := range []struct {
		change     func(r *store.Runner)
		want, what string
	}{
		{func(*store.Runner) {}, "", "idle 50 s > idle timeout 1 s, but within its boot timeout"},
		// Queued for create_vm long ago, its VM made 50 s ago: still booting.
		{func(r *store.Runner) { r.CreatedAt = t0.Add(-10 * time.Minute) }, "", "VM made 50 s ago (boot timeout 1 min), spawn queued 10 min ago"},
		{func(r *store.Runner) { r.StateAt = t0.Add(-61 * time.Second) }, "spawn timeout: never registered", "past its boot timeout, never online"},
		{func(r *store.Runner) { r.OnlineAt = t0.Add(-500 * time.Millisecond) }, "", "online half a second ago (idle timeout 1 s)"},
		{func(r *store.Runner) { r.OnlineAt = t0.Add(-2 * time.Second) }, "idle timeout", "online and idle 2 s"},
	} {
		step.change(&booting[0])
		d := plan(cfg, t0, lst(jobs), nil, booting, nil, nil, false)
		if step.want == "" && len(d.reap) != 0 || step.want != "" && d.reap["g-b"] != step.want {
			t.Errorf("%s: reap %v", step.what, d.reap)
		}
	}
}

func TestOwnerIsDeterministic(t *testing.T) {
	mk := func(name string, priority int, scope forge.Scope, labels ...string) *group {
		g := &group{scope: scope}
		g.setConf(config.GroupConfig{Name: name, Forge: "f", Labels: labels, Priority: priority})
		return g
	}
	o := &Orchestrator{}
	global := mk("global", 0, forge.Scope{Kind: "global"}, "linux")
	org := mk("org-big", 1, forge.Scope{Kind: "org", Owner: "acme"}, "linux", "x64", "docker")
	orgTight := mk("org-tight", 2, forge.Scope{Kind: "org", Owner: "acme"}, "linux", "x64")
	repo := mk("repo", 3, forge.Scope{Kind: "repo", Owner: "acme", Repo: "app"}, "linux")
	all := []*group{global, org, orgTight, repo}
	for _, c := range []struct {
		repo   string
		labels []string
		want   string
	}{
		{"acme/app", []string{"linux"}, "repo"},
		{"acme/lib", []string{"linux"}, "org-tight"},
		{"acme/lib", []string{"docker"}, "org-big"},
		{"other/x", []string{"linux"}, "global"},
		{"other/x", []string{"arm"}, ""},
	} {
		g := o.owner("f", forge.Job{Repo: c.repo, Labels: c.labels}, all)
		got := ""
		if g != nil {
			got = g.cfg().Name
		}
		if got != c.want {
			t.Errorf("%s %v claimed by %q, want %q", c.repo, c.labels, got, c.want)
		}
	}
	repo.drained = true
	if g := o.owner("f", forge.Job{Repo: "acme/app", Labels: []string{"linux"}}, all); g != orgTight {
		t.Errorf("with the repo group drained, the job falls to %v", g)
	}
	// Equal scope and labels: the higher priority, then the name, whatever
	// the order the groups are listed in.
	low, high, twin := mk("b-low", 0, forge.Scope{Kind: "org", Owner: "acme"}, "arm"),
		mk("z-high", 5, forge.Scope{Kind: "org", Owner: "acme"}, "arm"), mk("a-low", 0, forge.Scope{Kind: "org", Owner: "acme"}, "arm")
	job := forge.Job{Repo: "acme/app", Labels: []string{"arm"}}
	for _, order := range [][]*group{{low, high, twin}, {twin, high, low}} {
		if g := o.owner("f", job, order); g != high {
			t.Errorf("priority 5 against 0: claimed by %s", g.cfg().Name)
		}
	}
	for _, order := range [][]*group{{low, twin}, {twin, low}} {
		if g := o.owner("f", job, order); g != twin {
			t.Errorf("equal priorities: claimed by %s, want a-low (by name)", g.cfg().Name)
		}
	}
}

func TestPlanUnregisteredRunnerRetried(t *testing.T) {
	owned, jobs := queued(1)
	stale := []store.Runner{{Name: "g-x", State: store.Idle, TriggerJob: 1, CreatedAt: t0.Add(-11 * time.Minute), StateAt: t0.Add(-11 * time.Minute)}}
	cfg := testGroup(5, 0)
	cfg.Timeouts.Idle = config.Duration{Duration: time.Hour}
	d := plan(cfg, t0, lst(jobs), owned, stale, nil, nil, false)
	if d.reap["g-x"] == "" {
		t.Fatalf("a runner never seen registered past the spawn timeout is kept: %v", d.reap)
	}
	// A GitHub JIT runner has its registration id before it boots: only
	// being seen online counts.
	stale[0].ForgeRunnerID = 7
	if d := plan(cfg, t0, lst(jobs), owned, stale, nil, nil, false); d.reap["g-x"] == "" {
		t.Fatalf("a registration id alone kept a runner never seen online: %v", d.reap)
	}
	stale[0].OnlineAt = t0.Add(-10 * time.Minute)
	if d := plan(cfg, t0, lst(jobs), owned, stale, nil, nil, false); len(d.reap) != 0 || len(d.spawn) != 0 {
		t.Fatalf("an online idle runner is supply: reap %v spawn %v", d.reap, d.spawn)
	}
}

func TestPlanInflightSpawnIsSupplyUntilSettled(t *testing.T) {
	owned, jobs := queued(1)
	failing := []store.Runner{{Name: "g-f", State: store.Deleting, Reason: "create_vm failed", TriggerJob: 1, CreatedAt: t0}}
	d := plan(testGroup(5, 0), t0, lst(jobs), owned, failing, map[string]bool{"g-f": true}, nil, false)
	if len(d.reap) != 0 || len(d.spawn) != 0 {
		t.Fatalf("a spawn still deleting its own VM: reap %v spawn %v", d.reap, d.spawn)
	}
	d = plan(testGroup(5, 0), t0, lst(jobs), owned, failing, nil, nil, false)
	if d.reap["g-f"] != "create_vm failed" || len(d.spawn) != 1 || d.spawn[0] != 1 {
		t.Fatalf("a deleting row nobody works on is resumed and its job gets a runner: reap %v spawn %v", d.reap, d.spawn)
	}
}

// A runner a completed delivery named is reaped in the next pass, busy or
// idle, seen busy or not: it no longer counts as supply, and the queued
// job it would have covered gets a new runner at once.
func TestFinishedRunnersStopCountingAtOnce(t *testing.T) {
	owned, jobs := queued(1)
	runners := []store.Runner{
		{Name: "g-a", Group: "g", State: store.Idle, TriggerJob: 1, VMCID: "vm-a", CreatedAt: t0, StateAt: t0},
		{Name: "g-b", Group: "g", State: store.Busy, JobID: 9, VMCID: "vm-b", CreatedAt: t0, StateAt: t0},
	}
	d := plan(testGroup(2, 0), t0, lst(jobs), owned, runners, nil, map[string]bool{"g-a": true, "g-b": true}, false)
	if d.reap["g-a"] != "job finished" || d.reap["g-b"] != "job finished" {
		t.Fatalf("reap %v", d.reap)
	}
	if d.unassign != 0 {
		t.Errorf("a finished runner still counts as supply: %d unassigned", d.unassign)
	}
	// Not finished: the idle runner covers the job, nothing spawns.
	d = plan(testGroup(2, 0), t0, lst(jobs), owned, runners[:1], nil, nil, false)
	if len(d.reap) != 0 || len(d.spawn) != 0 {
		t.Errorf("reap %v spawn %v", d.reap, d.spawn)
	}
}

// Two forges of one Gitea (seed 001's groups each bring their token, so
// each is a forge of its own): their groups see the same jobs, and one
// claims each — the repo group, the more specific — so one runner is
// made per job, not one per group.
func TestGroupsOfOneForgeInstanceShareTheJobs(t *testing.T) {
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	cpi := &vmCPI{vms: map[string]map[string]any{}, giteaURL: srv.URL}
	startEngine(t, fmt.Sprintf(`
sweep_interval: 100ms
cpi: {path: /nonexistent}
forges:
  - {name: a, type: gitea, url: %q, token_env: UNUSED, poll_interval: 100ms}
  - {name: b, type: gitea, url: "%s/", token_env: UNUSED, poll_interval: 100ms}
groups:
  - {name: org, forge: a, scope: org, org: acme, labels: [linux], max_active_runners: 4, stemcell: {cid: sc-1}, runner: {command: /bin/true}}
  - {name: repo, forge: b, scope: repo, repo: acme/app, labels: [linux], max_active_runners: 4, stemcell: {cid: sc-1}, runner: {command: /bin/true}}
`, srv.URL, srv.URL), Options{CPI: cpi})
	srv.AddJob("acme/app", "build", []string{"linux"}, "queued")
	srv.AddJob("acme/app", "test", []string{"linux"}, "queued")
	srv.AddJob("acme/lib", "build", []string{"linux"}, "queued")
	eventually(t, 10*time.Second, "two runners of the repo group, one of the org group", func() bool {
		return cpi.count("repo") == 2 && cpi.count("org") == 1
	})
	if n := cpi.made(); n != 3 {
		t.Errorf("%d runners made for 3 jobs", n)
	}
}
