package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/cpiclient"
	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/gitea"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/rpc"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
	"github.com/runway-cpi/runway/src/testkit/forgetest/gitearunner"
)

// vmCPI answers as bin/cpi does, keeping its VMs in memory. With
// giteaURL, each VM registers its runner at the Gitea contract server
// with the token its user data carries, as the runner program would at
// boot; without, its runner never starts.
type vmCPI struct {
	mu       sync.Mutex
	n        int
	vms      map[string]map[string]any // cid → list_vms entry
	giteaURL string
	// registerAs: the names each VM's runner registers instead of its
	// labels' (a runner configured apart from the group).
	registerAs []string
}

// made counts the VMs ever made.
func (c *vmCPI) made() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

var exported = regexp.MustCompile(`(?m)^export ([A-Z_]+)='([^']*)'$`)

func (c *vmCPI) Call(_ context.Context, method, _ string, args ...any) (*cpiclient.Response, error) {
	ok := func(v any) (*cpiclient.Response, error) {
		b, _ := json.Marshal(v)
		return &cpiclient.Response{Reply: rpc.Reply{Result: b}}, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	switch method {
	case "create_vm":
		env := args[5].(map[string]any)
		if c.giteaURL != "" {
			if err := c.boot(env["user_data"].(string)); err != nil {
				e := &rpc.Error{Type: rpc.TypeVMCreationFailed, Message: err.Error()}
				return &cpiclient.Response{Reply: rpc.Reply{Error: e}}, e
			}
		}
		c.n++
		cid := fmt.Sprintf("vm-%d", c.n)
		tags := env["bosh"].(map[string]any)["tags"].(map[string]any)
		c.vms[cid] = map[string]any{"cid": cid, "agent_id": args[0], "state": "running", "tags": tags}
		return ok([]any{cid, map[string]any{}})
	case "list_vms":
		want := args[0].(map[string]string)["runway_group"]
		out := []any{}
		for _, vm := range c.vms {
			if vm["tags"].(map[string]any)["runway_group"] == want {
				out = append(out, vm)
			}
		}
		return ok(out)
	case "delete_vm":
		delete(c.vms, args[0].(string))
		return ok(nil)
	case "has_vm":
		_, found := c.vms[args[0].(string)]
		return ok(found)
	}
	return ok(nil)
}

// boot registers the runner whose settings userData exports.
func (c *vmCPI) boot(userData string) error {
	vars := map[string]string{}
	for _, m := range exported.FindAllStringSubmatch(userData, -1) {
		vars[m[1]] = m[2]
	}
	name := vars["GITEA_RUNNER_NAME"]
	labels := forge.LabelNames(strings.Split(vars["GITEA_RUNNER_LABELS"], ","))
	if c.registerAs != nil {
		labels = c.registerAs
	}
	r, err := gitearunner.Register(c.giteaURL, vars["GITEA_RUNNER_REGISTRATION_TOKEN"], name, labels, true)
	if err != nil {
		return err
	}
	if c.registerAs != nil {
		r.FetchTask() // it asks for a task, as a runner does: online, given none
	}
	return nil
}

func (c *vmCPI) count(group string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, vm := range c.vms {
		if vm["tags"].(map[string]any)["runway_group"] == group {
			n++
		}
	}
	return n
}

// eventually polls cond (every 20 ms) until it holds or d passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("not within %s: %s", d, what)
		}
	}
}

func statusOf(o *Orchestrator, name string) (GroupStatus, bool) {
	for _, s := range o.Groups() {
		if s.Name == name {
			return s, true
		}
	}
	return GroupStatus{}, false
}

// startOnGitea runs an engine (daemon keys extra) of groups, YAML list
// items, on one Gitea forge at url (token "tok", polled every 100 ms),
// until the test ends.
func startOnGitea(t *testing.T, url, extra, groups string, cpi CPI, events func(RunnerEvent)) (*Orchestrator, *config.Config) {
	return startOnGiteaWith(t, url, extra, groups, Options{CPI: cpi, Events: events})
}

// startOnGiteaWith is startOnGitea with more options.
func startOnGiteaWith(t *testing.T, url, extra, groups string, opt Options) (*Orchestrator, *config.Config) {
	return startEngine(t, fmt.Sprintf(`
%s
cpi: {path: /nonexistent}
forges:
  - {name: gitea, type: gitea, url: %q, token_env: UNUSED, poll_interval: 100ms}
groups:%s
`, extra, url, groups), opt)
}

// startEngine runs an engine of doc (runway.yml without state_dir), its
// forges' clients Gitea's with token "tok", until the test ends.
func startEngine(t *testing.T, doc string, opt Options) (*Orchestrator, *config.Config) {
	t.Helper()
	cfg, err := config.ParseConfig([]byte("state_dir: " + t.TempDir() + "\n" + doc))
	if err != nil {
		t.Fatal(err)
	}
	opt.Logger = logging.Discard()
	opt.NewForge = func(fc config.ForgeConfig) (Forge, error) {
		return Forge{Client: gitea.New(fc.URL, forge.NewTransport(func() string { return "token tok" }))}, nil
	}
	o, err := New(cfg, opt)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { o.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done; o.Close() })
	return o, cfg
}

// A running engine takes a new set through Replace: a group's
// max_active_runners raised takes effect without a restart, a group
// added starts at once, a group left out is retired — its VMs deleted,
// its registrations removed — and then dropped; a change to what a
// group's runners were made with, or an invalid group, is refused by
// field and changes nothing.
func TestReplaceChangesGroupsWhileRunning(t *testing.T) {
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	cpi := &vmCPI{vms: map[string]map[string]any{}, giteaURL: srv.URL}
	var evMu sync.Mutex
	events := map[string]int{}
	o, cfg := startOnGitea(t, srv.URL, "sweep_interval: 200ms", `
  - {name: a, scope: org, org: acme, labels: [linux], max_active_runners: 1, stemcell: {cid: sc-1}, runner: {command: /bin/true}}`,
		cpi, func(e RunnerEvent) {
			evMu.Lock()
			events[e.Group+"/"+e.Type]++
			evMu.Unlock()
		})
	for range 3 {
		srv.AddJob("acme/app", "build", []string{"linux"}, "queued")
	}
	eventually(t, 10*time.Second, "one runner for group a", func() bool { return cpi.count("a") == 1 })

	forges := cfg.Forges
	groupA := cfg.Groups[0]
	groupA.MaxActiveRunners = 3
	if err := o.Replace(forges, []config.GroupConfig{groupA}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "three runners once max_active_runners is 3", func() bool { return cpi.count("a") == 3 })

	groupB := config.GroupConfig{Name: "b", Scope: "repo", Repo: "acme/lib", Labels: []string{"arm"}, MaxActiveRunners: 2,
		Stemcell: config.StemcellConfig{CID: "sc-1"}, Runner: config.RunnerConfig{Command: "/bin/true"}}
	if err := o.Replace(forges, []config.GroupConfig{groupA, groupB}); err != nil {
		t.Fatal(err)
	}
	srv.AddJob("acme/lib", "arm build", []string{"arm"}, "queued")
	eventually(t, 10*time.Second, "a runner of the added group b", func() bool { return cpi.count("b") == 1 })

	// Refused whole: b's scope changed (its runners were made at acme/lib),
	// and a group without labels. Group a keeps its three runners.
	moved := groupB
	moved.Repo = "acme/other"
	var ie *IdentityError
	if err := o.Replace(forges, []config.GroupConfig{groupA, moved}); !errors.As(err, &ie) || ie.Field != "groups[1].repo" {
		t.Errorf("changing a group's repo: %v, want an IdentityError naming groups[1].repo", err)
	}
	bad := groupA
	bad.Labels = nil
	var fe *config.FieldError
	if err := o.Replace(forges, []config.GroupConfig{bad}); !errors.As(err, &fe) || fe.Field != "groups[0].labels" {
		t.Errorf("a group without labels: %v, want a FieldError naming groups[0].labels", err)
	}
	if s, _ := statusOf(o, "b"); s.Retiring || len(o.Groups()) != 2 {
		t.Errorf("after refused sets: %+v", o.Groups())
	}

	// b marked to retire: kept, reported retired once its runner, VM and
	// registration are gone; a left out: retired, then dropped.
	groupB.Retire = true
	if err := o.Replace(forges, []config.GroupConfig{groupB}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "group a dropped, group b retired", func() bool {
		_, hasA := statusOf(o, "a")
		b, hasB := statusOf(o, "b")
		return !hasA && hasB && b.Retired
	})
	if n := cpi.count("a") + cpi.count("b"); n != 0 {
		t.Errorf("%d VMs left after retiring both groups", n)
	}
	if rs := srv.Runners(); len(rs) != 0 {
		t.Errorf("registrations left after retiring both groups: %+v", rs)
	}
	if rows, _ := o.Store().Active("a"); len(rows) != 0 {
		t.Errorf("runner rows of a left: %+v", rows)
	}
	evMu.Lock()
	defer evMu.Unlock()
	if events["a/created"] != 3 || events["a/deleted"] != 3 || events["b/created"] != 1 || events["b/deleted"] != 1 {
		t.Errorf("events: %v; want 3 created and 3 deleted for a, 1 and 1 for b", events)
	}
}
