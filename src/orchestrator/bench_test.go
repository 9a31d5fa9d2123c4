package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/cpiclient"
	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/forgetest"
	"github.com/runway-cpi/runway/src/forge/gitea"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/rpc"
	"github.com/runway-cpi/runway/src/testkit/pgtest"
)

// BenchmarkReconcilePass is the CPU of one full pass over 100 groups and
// 10,000 queued jobs: ownership of every job (shared per listing) and each
// group's plan. Forge and CPI I/O are not included: they are the forge's
// and the CPI's time, bounded by timeouts.
func BenchmarkReconcilePass(b *testing.B) {
	const nGroups, nJobs = 100, 10000
	o := &Orchestrator{}
	fv := &forgeView{cfg: config.ForgeConfig{Name: "f"}}
	for i := 0; i < nGroups; i++ {
		labels := []string{fmt.Sprintf("pool-%d", i), "linux:host"}
		scope := forge.Scope{Kind: "org", Owner: fmt.Sprintf("org%d", i%10)}
		o.groups = append(o.groups, &group{o: o, index: i, scope: scope, labels: forge.NewLabelSet(labels),
			cfg: config.GroupConfig{Name: fmt.Sprintf("g%d", i), Forge: "f", Labels: labels, MaxActiveRunners: 50,
				Timeouts: config.Timeouts{Idle: config.Duration{Duration: time.Hour}, MaxLifetime: config.Duration{Duration: time.Hour}}}})
	}
	jobs := map[int64]forge.Job{}
	for i := 0; i < nJobs; i++ {
		jobs[int64(i+1)] = forge.Job{ID: int64(i + 1), Repo: fmt.Sprintf("org%d/repo%d", i%10, i%37),
			Labels: []string{fmt.Sprintf("pool-%d", i%nGroups), "linux"}, Status: forge.StatusQueued}
	}
	now := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		sj := &scopeJobs{jobs: jobs} // a fresh listing each pass
		l := o.partition(fv, sj)
		spawns := 0
		for _, g := range o.groups {
			d := plan(&g.cfg, now, l, l.owned[g.cfg.Name], nil, nil, nil, false)
			spawns += len(d.spawn)
		}
		if spawns != nGroups*50 {
			b.Fatalf("%d spawns planned", spawns)
		}
	}
}

// recordingCPI answers like bin/cpi on the local driver and notes when
// each create_vm arrived.
type recordingCPI struct {
	mu         sync.Mutex
	created    chan time.Time
	n          int
	failCreate bool // answer create_vm with VMCreationFailed
}

func (c *recordingCPI) creates() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (c *recordingCPI) Call(_ context.Context, method, _ string, _ ...any) (*cpiclient.Response, error) {
	switch method {
	case "create_vm":
		c.created <- time.Now()
		c.mu.Lock()
		c.n++
		n := c.n
		c.mu.Unlock()
		if c.failCreate {
			e := &rpc.Error{Type: rpc.TypeVMCreationFailed, Message: "no capacity", OkToRetry: true}
			return &cpiclient.Response{Reply: rpc.Reply{Error: e}}, e
		}
		return &cpiclient.Response{Reply: rpc.Reply{Result: json.RawMessage(fmt.Sprintf(`["vm-%d",{}]`, n))}}, nil
	case "list_vms":
		return &cpiclient.Response{Reply: rpc.Reply{Result: json.RawMessage(`[]`)}}, nil
	case "has_vm":
		return &cpiclient.Response{Reply: rpc.Reply{Result: json.RawMessage(`true`)}}, nil
	}
	return &cpiclient.Response{Reply: rpc.Reply{Result: json.RawMessage(`null`)}}, nil
}

func benchOrchestrator(b testing.TB, srv *forgetest.Gitea, poll, sweep time.Duration, cpi *recordingCPI, top ...string) (*Orchestrator, *recordingCPI, *httptest.Server, context.CancelFunc) {
	dir := b.TempDir()
	os.WriteFile(filepath.Join(dir, "secret"), []byte("s"), 0o600)
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(`
%s
state_dir: %s
sweep_interval: %s
cpi: {path: /nonexistent}
forges:
  - {name: gitea, type: gitea, url: %q, token_env: UNUSED, webhook_secret_file: %s, poll_interval: %s}
groups:
  - {name: g, scope: org, org: acme, labels: [linux], max_active_runners: 100000, stemcell: {cid: sc-1}, runner: {command: /bin/true}}
`, strings.Join(top, "\n"), dir, sweep, srv.URL, filepath.Join(dir, "secret"), poll)))
	if err != nil {
		b.Fatal(err)
	}
	if cpi == nil {
		cpi = &recordingCPI{created: make(chan time.Time, 100000)}
	}
	client := gitea.New(srv.URL, forge.NewTransport(func() string { return "token " + srv.APIToken }))
	o, err := New(cfg, Options{CPI: cpi, Forges: map[string]Forge{"gitea": {Client: client, Secret: func() string { return "s" }}},
		Logger: logging.Discard()})
	if err != nil {
		b.Fatal(err)
	}
	h, _ := o.Handler()
	web := httptest.NewServer(h)
	ctx, cancel := context.WithCancel(context.Background())
	go o.Run(ctx)
	return o, cpi, web, func() { cancel(); web.Close(); o.Close() }
}

// BenchmarkWebhookToCreateVM: a workflow_job delivery reaches the daemon,
// which issues create_vm — with the poll interval at an hour, only the
// webhook can have caused it.
func BenchmarkWebhookToCreateVM(b *testing.B) {
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	_, cpi, web, stop := benchOrchestrator(b, srv, time.Hour, time.Hour, nil)
	defer stop()
	measureWebhooks(b, srv, cpi, web.URL)
}

// measureWebhooks queues b.N jobs at srv, whose hook delivers to url, and
// reports the mean time from queueing to create_vm.
func measureWebhooks(b *testing.B, srv *forgetest.Gitea, cpi *recordingCPI, url string) {
	srv.AddHook(url+"/webhooks/gitea", []byte("s"))
	time.Sleep(200 * time.Millisecond) // let the first (empty) passes finish
	var total time.Duration
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		start := time.Now()
		srv.AddJob("acme/app", "j", []string{"linux"}, forge.StatusQueued)
		at := <-cpi.created
		total += at.Sub(start)
	}
	b.ReportMetric(float64(total.Microseconds())/float64(b.N)/1000, "ms/webhook-to-create_vm")
}

// BenchmarkWebhookToCreateVMReplicas is BenchmarkWebhookToCreateVM with
// three replicas on one PostgreSQL store: the delivery reaches the acting
// replica, or a standby, which relays it (NOTIFY) to the acting one.
func BenchmarkWebhookToCreateVMReplicas(b *testing.B) {
	dsn := pgtest.Database(b)
	dsnFile := filepath.Join(b.TempDir(), "dsn")
	os.WriteFile(dsnFile, []byte(dsn), 0o600)
	for _, to := range []string{"acting", "standby"} {
		b.Run("to-"+to, func(b *testing.B) {
			srv := forgetest.NewGitea("tok")
			defer srv.Close()
			cpi := &recordingCPI{created: make(chan time.Time, 100000)}
			var reps []*Orchestrator
			var webs []*httptest.Server
			for i := 0; i < 3; i++ {
				o, _, web, stop := benchOrchestrator(b, srv, time.Hour, time.Hour, cpi, "store: postgres", "postgres: {dsn_file: "+dsnFile+"}")
				defer stop()
				reps, webs = append(reps, o), append(webs, web)
			}
			acting := -1
			for deadline := time.Now().Add(10 * time.Second); acting < 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				for i, o := range reps {
					if o.group("g").Status().Acting {
						acting = i
					}
				}
			}
			if acting < 0 {
				b.Fatal("no replica acts for the group")
			}
			target := acting
			if to == "standby" {
				target = (acting + 1) % len(reps)
			}
			measureWebhooks(b, srv, cpi, webs[target].URL)
		})
	}
}

// BenchmarkSteadyStateForgeRequests counts the forge requests one group
// makes per minute with nothing to do, at the default intervals (15 s
// poll, 30 s sweep), measured at 1/30 of those intervals and scaled back.
func BenchmarkSteadyStateForgeRequests(b *testing.B) {
	for n := 0; n < b.N; n++ {
		srv := forgetest.NewGitea("tok")
		for i := 0; i < 10; i++ {
			id := srv.AddJob("acme/app", "j", []string{"windows"}, forge.StatusQueued) // nobody's
			_ = id
		}
		_, _, _, stop := benchOrchestrator(b, srv, 500*time.Millisecond, time.Second, nil)
		time.Sleep(6 * time.Second) // the measured window: 1/30 of 3 minutes
		stop()
		total := 0
		for _, v := range srv.Requests() {
			total += v
		}
		srv.Close()
		b.ReportMetric(float64(total)/3, "forge-requests/min")
	}
}
