package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/cpiclient"
	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/github"
	"github.com/runway-cpi/runway/src/forge/scaleset"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/rpc"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// quietCPI makes VMs in memory whose runners never start.
type quietCPI struct {
	mu  sync.Mutex
	n   int
	vms map[string]map[string]any
}

func (c *quietCPI) Call(_ context.Context, method, _ string, args ...any) (*cpiclient.Response, error) {
	ok := func(v any) (*cpiclient.Response, error) {
		b, _ := json.Marshal(v)
		return &cpiclient.Response{Reply: rpc.Reply{Result: b}}, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch method {
	case "create_vm":
		c.n++
		cid := fmt.Sprintf("vm-%d", c.n)
		tags := args[5].(map[string]any)["bosh"].(map[string]any)["tags"]
		c.vms[cid] = map[string]any{"cid": cid, "agent_id": args[0], "state": "running", "tags": tags}
		return ok([]any{cid, map[string]any{}})
	case "list_vms":
		out := []any{}
		for _, vm := range c.vms {
			out = append(out, vm)
		}
		return ok(out)
	case "delete_vm":
		delete(c.vms, args[0].(string))
	}
	return ok(nil)
}

func (c *quietCPI) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.vms)
}

// A scale-set group in the engine: drained, it acquires nothing; resumed,
// its job gets a runner; retired, its session is deleted, its runner
// removed and its scale set deleted at the service (GitHub would go on
// routing jobs to it).
func TestScaleSetGroupDrainedAndRetired(t *testing.T) {
	gh := forgetest.NewGitHub("tok")
	defer gh.Close()
	cpi := &quietCPI{vms: map[string]map[string]any{}}
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(`
state_dir: %s
sweep_interval: 200ms
cpi: {path: /nonexistent}
forges:
  - {name: gh, type: github, url: %q, runner_url: %q, token_env: UNUSED}
groups:
  - {name: ss, scope: org, org: acme, labels: [runway-ss], max_active_runners: 2, demand: scale_set, stemcell: {cid: sc-1}, runner: {command: /bin/true}}
`, t.TempDir(), gh.URL, gh.URL)))
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
	o, err := New(cfg, Options{CPI: cpi, NewForge: newForge, Logger: logging.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	if _, err := o.SetDrained("ss", true); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go o.Run(ctx)
	eventually(t, 10*time.Second, "the session", func() bool {
		s, _ := statusOf(o, "ss")
		return s.ScaleSet != nil && s.ScaleSet.Session
	})
	job := gh.AddJob("acme/app", []string{"runway-ss"})
	eventually(t, 10*time.Second, "the drained group's poll told the service it holds nothing", func() bool {
		return gh.ActionsStats().MaxCapacity == 0 && gh.ScaleSets()[0].ID != 0
	})
	if gh.Job(job).ScaleSet != 0 || cpi.count() != 0 {
		t.Fatalf("a drained group acquired job %+v or made %d VMs", gh.Job(job), cpi.count())
	}
	if _, err := o.SetDrained("ss", false); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the job acquired and a runner made", func() bool { return gh.Job(job).ScaleSet != 0 && cpi.count() == 1 })

	g := cfg.Groups[0]
	g.Retire = true
	if err := o.Replace(cfg.Forges, []config.GroupConfig{g}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "retired", func() bool {
		s, _ := statusOf(o, "ss")
		return s.Retired
	})
	if n, sets, runners := cpi.count(), gh.ScaleSets(), gh.RunnerCount(); n != 0 || len(sets) != 0 || runners != 0 {
		t.Errorf("after retiring: %d VMs, scale sets %+v, %d runners registered; want none", n, sets, runners)
	}
	if v, _ := o.Store().Meta("scale_set_session/ss"); v != "" {
		t.Errorf("session record %q left", v)
	}
}
