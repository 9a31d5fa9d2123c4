package orchestrator

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/github"
	"github.com/runway-cpi/runway/src/forge/scaleset"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// scaleSetEngine is an engine with one scale-set group "ss" (org acme,
// label runway-ss; extra its further keys) against a contract server
// gh, its VMs cpi's; it runs from start on until the test ends.
func scaleSetEngine(t *testing.T, extra string) (o *Orchestrator, cfg *config.Config, gh *forgetest.GitHub, cpi *vmCPI, start func()) {
	gh = forgetest.NewGitHub("tok")
	t.Cleanup(gh.Close)
	cpi = &vmCPI{vms: map[string]map[string]any{}}
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(`
state_dir: %s
sweep_interval: 200ms
cpi: {path: /nonexistent}
forges:
  - {name: gh, type: github, url: %q, runner_url: %q, token_env: UNUSED}
groups:
  - {name: ss, scope: org, org: acme, labels: [runway-ss], demand: scale_set, stemcell: {cid: sc-1}, runner: {command: /bin/true}%s}
`, t.TempDir(), gh.URL, gh.URL, extra)))
	if err != nil {
		t.Fatal(err)
	}
	newForge := func(fc config.ForgeConfig) (Forge, error) {
		rest := forge.NewTransport(func() string { return "Bearer tok" })
		c, err := github.New(fc.URL, rest)
		return Forge{Client: c, ScaleSets: func(s forge.Scope) (*scaleset.Client, error) {
			return scaleset.New(scaleset.Config{APIURL: fc.URL, ConfigURL: scaleset.ConfigURL(fc.RunnerURL, s), Scope: s,
				REST: rest, Actions: forge.NewTransport(nil)})
		}}, err
	}
	o, err = New(cfg, Options{CPI: cpi, NewForge: newForge, Logger: logging.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { o.Close() })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return o, cfg, gh, cpi, func() { go o.Run(ctx) }
}

// A scale-set group in the engine: drained, it holds no session (a
// session telling capacity 0 may still be assigned jobs: the service's
// doing then is not known) and the job queued meanwhile stays the
// service's; resumed, a session opens and the job gets a runner at once;
// retired, its session is deleted, its runner removed and its scale set
// deleted at the service (GitHub would go on routing jobs to it).
func TestScaleSetGroupDrainedAndRetired(t *testing.T) {
	o, cfg, gh, cpi, start := scaleSetEngine(t, ", max_active_runners: 2")
	if _, err := o.SetDrained("ss", true); err != nil {
		t.Fatal(err)
	}
	start()
	eventually(t, 10*time.Second, "the drained group holds no session", func() bool {
		s, _ := statusOf(o, "ss")
		return s.ScaleSet != nil && s.ScaleSet.Paused
	})
	job := gh.AddJob("acme/app", []string{"runway-ss"})
	if n := gh.OpenSessions(); n != 0 || gh.Job(job).ScaleSet != 0 || cpi.count("ss") != 0 {
		t.Fatalf("drained: %d sessions, job %+v, %d VMs; want none, the job the service's", n, gh.Job(job), cpi.count("ss"))
	}
	if _, err := o.SetDrained("ss", false); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the job assigned and a runner made", func() bool { return gh.Job(job).ScaleSet != 0 && cpi.count("ss") == 1 })

	g := cfg.Groups[0]
	g.Retire = true
	if err := o.Replace(cfg.Forges, []config.GroupConfig{g}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "retired", func() bool {
		s, _ := statusOf(o, "ss")
		return s.Retired
	})
	if n, sets, runners := cpi.count("ss"), gh.ScaleSets(), gh.RunnerCount(); n != 0 || len(sets) != 0 || runners != 0 {
		t.Errorf("after retiring: %d VMs, scale sets %+v, %d runners registered; want none", n, sets, runners)
	}
	if v, _ := o.Store().Meta("scale_set_session/ss"); v != "" {
		t.Errorf("session record %q left", v)
	}
}

// The desired-runners gauge is what the planner plans: with min_idle 1
// and two jobs waiting, two runners (max(2, 1)), not ARC's min_idle +
// assigned (3).
func TestScaleSetDesiredRunnersIsThePlan(t *testing.T) {
	o, _, gh, cpi, start := scaleSetEngine(t, ", max_active_runners: 4, min_idle: 1")
	start()
	eventually(t, 10*time.Second, "the session", func() bool {
		s, _ := statusOf(o, "ss")
		return s.ScaleSet != nil && s.ScaleSet.Session
	})
	gh.AddJob("acme/app", []string{"runway-ss"})
	gh.AddJob("acme/app", []string{"runway-ss"})
	var s GroupStatus
	eventually(t, 10*time.Second, "two jobs held and their runners made", func() bool {
		s, _ = statusOf(o, "ss")
		return s.ScaleSet != nil && s.ScaleSet.AssignedJobs == 2 && cpi.count("ss") == 2
	})
	if s.ScaleSet.DesiredRunners != 2 {
		t.Errorf("desired runners %d with %d VMs made; want 2, the plan", s.ScaleSet.DesiredRunners, cpi.count("ss"))
	}
	if v := metricGauge(t, o, "runway_scaleset_desired_runners"); v != 2 {
		t.Errorf("the gauge says %v; want 2", v)
	}
}

// gauge is a series' value (its one label set).
func metricGauge(t *testing.T, o *Orchestrator, name string) float64 {
	mfs, err := o.Metrics().Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}
