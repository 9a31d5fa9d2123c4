package orchestrator

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/gitea"
	"github.com/runway-cpi/runway/src/forge/github"
	"github.com/runway-cpi/runway/src/forge/scaleset"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// aloneDeps are a group's dependencies without a daemon: its own store,
// a partition that gives the group every queued job, no fence.
func aloneDeps(t *testing.T) *groupDeps {
	st, err := store.Open(filepath.Join(t.TempDir(), "runway.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	log := logging.Fields{Logger: logging.Discard()}
	return &groupDeps{store: st, log: log, redact: &logging.Redactor{}, metrics: NewMetrics(), hist: &History{},
		now: time.Now, fenced: func() error { return nil }, leader: sole{}, replica: "alone",
		stemcells: &stemcells{}, event: func(string, string, string, string) {}, failure: func(string, string, error) {},
		observeJob: func(forge.Job, bool) {}, firstStart: func(string) bool { return true },
		partition: func(_ *forgeView, sj *scopeJobs) listing {
			sj.mu.Lock()
			defer sj.mu.Unlock()
			l := listing{jobs: map[int64]forge.Job{}, running: map[string]forge.Job{}, owned: map[string][]forge.Job{}}
			for id, j := range sj.jobs {
				l.jobs[id] = j
				switch {
				case j.Status == forge.StatusInProgress && j.RunnerName != "":
					l.running[j.RunnerName] = j
				case j.Status == forge.StatusQueued:
					l.owned["g"] = append(l.owned["g"], j)
				}
			}
			sort.Slice(l.owned["g"], func(a, b int) bool { return l.owned["g"][a].ID < l.owned["g"][b].ID })
			return l
		},
		ownershipChanged: func() {}, drop: func(*group) {}}
}

// aloneConfig is one forge and one group "g" of doc's group line.
func aloneConfig(t *testing.T, forgeLine, groupLine string) (config.ForgeConfig, config.GroupConfig) {
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf("state_dir: %s\ncpi: {path: /nonexistent}\nforges:\n  - %s\ngroups:\n  - %s\n",
		t.TempDir(), forgeLine, groupLine)))
	if err != nil {
		t.Fatal(err)
	}
	return cfg.Forges[0], cfg.Groups[0]
}

// A group built alone (its dependencies, a Gitea contract server, an
// in-memory CPI; no daemon) makes a runner for each job queued for it,
// within max_active_runners. A runner whose VM went away is swept before
// the pass plans: the plan in the same pass counts it as no supply and
// makes a runner for the job it was made for.
func TestGroupAloneSweepsThenPlansOnce(t *testing.T) {
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	fc, gc := aloneConfig(t, fmt.Sprintf("{name: gitea, type: gitea, url: %q, token_env: UNUSED, poll_interval: 1h}", srv.URL),
		"{name: g, scope: org, org: acme, labels: [app], max_active_runners: 2, stemcell: {cid: sc-1}, runner: {command: /bin/true}}")
	for range 3 {
		srv.AddJob("acme/app", "build", []string{"app"}, "queued")
	}
	dep := aloneDeps(t)
	fv := newForgeView(fc, Forge{Client: gitea.New(fc.URL, forge.NewTransport(func() string { return "token tok" }))}, func(forge.Job) {})
	cpi := &vmCPI{vms: map[string]map[string]any{}}
	g, err := newGroup(dep, gc, fv, cpi, false)
	if err != nil {
		t.Fatal(err)
	}
	g.spawnSem = make(chan struct{}, 4)
	ctx := context.Background()
	if err := g.pass(ctx); err != nil {
		t.Fatal(err)
	}
	g.spawns.Wait()
	if n := cpi.count("g"); n != 2 {
		t.Fatalf("3 jobs queued, max 2: %d VMs made", n)
	}
	// One VM goes away (its host lost it); the next pass's sweep is due.
	var goneCID, goneRunner string
	cpi.mu.Lock()
	for cid, vm := range cpi.vms {
		goneCID, goneRunner = cid, vm["agent_id"].(string)
		break
	}
	delete(cpi.vms, goneCID)
	cpi.mu.Unlock()
	g.sweepDue = true
	if err := g.pass(ctx); err != nil {
		t.Fatal(err)
	}
	g.spawns.Wait()
	r, err := dep.store.Get(goneRunner)
	if err != nil || r.State != store.Deleted || r.Reason != "vm gone" {
		t.Fatalf("runner %s of the VM gone: %+v (%v); want deleted, vm gone", goneRunner, r, err)
	}
	if n := cpi.count("g"); n != 2 {
		t.Errorf("after the sweep: %d VMs; want 2 (a runner made in the same pass for the job the gone one was made for)", n)
	}
	if active, _ := dep.store.Active("g"); len(active) != 2 {
		t.Errorf("%d active runners; want 2", len(active))
	}
}

// A scale-set group built alone plans with what its scale set assigned
// the same way as with a forge's queued jobs: one job assigned, one
// runner made by the pass.
func TestGroupAloneScaleSetDemandIsThePlansInput(t *testing.T) {
	gh := forgetest.NewGitHub("tok")
	defer gh.Close()
	fc, gc := aloneConfig(t, fmt.Sprintf("{name: gh, type: github, url: %q, runner_url: %q, token_env: UNUSED}", gh.URL, gh.URL),
		"{name: g, scope: org, org: acme, labels: [runway-ss], demand: scale_set, max_active_runners: 3, stemcell: {cid: sc-1}, runner: {command: /bin/true}}")
	rest := forge.NewTransport(func() string { return "Bearer tok" })
	c, err := github.New(fc.URL, rest)
	if err != nil {
		t.Fatal(err)
	}
	f := Forge{Client: c, ScaleSets: func(s forge.Scope) (*scaleset.Client, error) {
		return scaleset.New(scaleset.Config{APIURL: fc.URL, ConfigURL: scaleset.ConfigURL(fc.RunnerURL, s), Scope: s,
			REST: rest, Actions: forge.NewTransport(nil)})
	}}
	dep := aloneDeps(t)
	cpi := &vmCPI{vms: map[string]map[string]any{}}
	g, err := newGroup(dep, gc, newForgeView(fc, f, func(forge.Job) {}), cpi, false)
	if err != nil {
		t.Fatal(err)
	}
	g.spawnSem = make(chan struct{}, 4)
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel(); g.demand.stop() }()
	g.demand.start(ctx)
	eventually(t, 10*time.Second, "the session", func() bool { return g.ss.listener.State().Session })
	gh.AddJob("acme/app", []string{"runway-ss"})
	eventually(t, 10*time.Second, "the job assigned", func() bool { return g.ss.listener.State().Demand() == 1 })
	if err := g.pass(ctx); err != nil {
		t.Fatal(err)
	}
	g.spawns.Wait()
	if n := cpi.count("g"); n != 1 {
		t.Errorf("one job assigned: %d VMs made; want 1", n)
	}
}
