package httpapi

// The daemon in process behind its HTTP interface: webhook deliveries to
// create_vm, replicas relaying deliveries and drains, forge requests at
// rest.

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
	"github.com/runway-cpi/runway/src/forge/gitea"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/rpc"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
	"github.com/runway-cpi/runway/src/testkit/pgtest"
)

// status is a group's status as o reports it.
func status(o *orchestrator.Orchestrator, name string) orchestrator.GroupStatus {
	for _, g := range o.Groups() {
		if g.Name == name {
			return g
		}
	}
	return orchestrator.GroupStatus{}
}

// recordingCPI answers like bin/cpi on the local driver and notes when
// each create_vm arrived.
type recordingCPI struct {
	mu         sync.Mutex
	created    chan time.Time
	n          int
	failCreate bool   // answer create_vm with VMCreationFailed
	failWith   string // answer create_vm and list_vms with a CloudError saying this
}

func (c *recordingCPI) creates() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (c *recordingCPI) Call(_ context.Context, method, _ string, _ ...any) (*cpiclient.Response, error) {
	if c.failWith != "" && (method == "create_vm" || method == "list_vms") {
		e := &rpc.Error{Type: rpc.TypeCloudError, Message: c.failWith}
		return &cpiclient.Response{Reply: rpc.Reply{Error: e}}, e
	}
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

func benchOrchestrator(b testing.TB, srv *forgetest.Gitea, poll, sweep time.Duration, cpi *recordingCPI, top ...string) (*orchestrator.Orchestrator, *recordingCPI, *httptest.Server, context.CancelFunc) {
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
	o, err := orchestrator.New(cfg, orchestrator.Options{CPI: cpi, Forges: map[string]orchestrator.Forge{"gitea": {Client: client, Secret: func() string { return "s" }}},
		Logger: logging.Discard()})
	if err != nil {
		b.Fatal(err)
	}
	h, _ := Handler(o, cfg, logging.Fields{Logger: logging.Discard()}, &logging.Redactor{}, nil)
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
			var reps []*orchestrator.Orchestrator
			var webs []*httptest.Server
			for i := 0; i < 3; i++ {
				o, _, web, stop := benchOrchestrator(b, srv, time.Hour, time.Hour, cpi, "store: postgres", "postgres: {dsn_file: "+dsnFile+"}")
				defer stop()
				reps, webs = append(reps, o), append(webs, web)
			}
			acting := -1
			for deadline := time.Now().Add(10 * time.Second); acting < 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				for i, o := range reps {
					if status(o, "g").Acting {
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

// Three replicas on one PostgreSQL store with an hour's poll interval:
// exactly one acts; a webhook delivered to a standby still makes the
// acting replica spawn (relayed, not polled), once; a drain sent to a
// standby stops the acting replica's spawns.
func TestStandbyRelaysWebhooksAndDrains(t *testing.T) {
	dsnFile := filepath.Join(t.TempDir(), "dsn")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(dsnFile, []byte(pgtest.Database(t)), 0o600))
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	cpi := &recordingCPI{created: make(chan time.Time, 100)}
	var reps []*orchestrator.Orchestrator
	var urls []string
	for i := 0; i < 3; i++ {
		o, _, web, stop := benchOrchestrator(t, srv, time.Hour, time.Hour, cpi, "store: postgres", "postgres: {dsn_file: "+dsnFile+"}")
		defer stop()
		reps, urls = append(reps, o), append(urls, web.URL)
	}
	acting := func() []int {
		var out []int
		for i, o := range reps {
			if status(o, "g").Acting {
				out = append(out, i)
			}
		}
		return out
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(acting()) != 1 {
		if n := len(acting()); n > 1 {
			t.Fatalf("%d replicas act at once", n)
		}
		if time.Now().After(deadline) {
			t.Fatal("no replica acts for the group within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	standby := (acting()[0] + 1) % 3
	srv.AddHook(urls[standby]+"/webhooks/gitea", []byte("s"))
	srv.AddJob("acme/app", "j", []string{"linux"}, forge.StatusQueued)
	select {
	case <-cpi.created:
	case <-time.After(10 * time.Second):
		t.Fatal("a delivery to a standby made no runner (poll interval 1h: only the relay can)")
	}
	if _, err := reps[standby].SetDrained("g", true); err != nil {
		t.Fatal(err)
	}
	leader := reps[acting()[0]]
	for deadline := time.Now().Add(10 * time.Second); !status(leader, "g").Drained; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the acting replica did not learn of the drain sent to a standby")
		}
	}
	queued := time.Now()
	srv.AddJob("acme/app", "j2", []string{"linux"}, forge.StatusQueued)
	// A pass that started after the job was queued lists it: wait for one,
	// then count what the passes decided (intent rows come before spawns).
	for deadline := time.Now().Add(10 * time.Second); !status(leader, "g").LastCheckTime.After(queued); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no pass of the acting replica after the second delivery")
		}
	}
	// Every runner ever made (the drain also retires the first one).
	rows, err := leader.Store().All(100)
	if err != nil || len(rows) != 1 {
		t.Errorf("%d runners (%v), want 1: the job queued after the drain got one", len(rows), err)
	}
}

// A create_vm that fails at once must back the group off, not be retried
// in a tight loop: the pass after a failed spawn makes no new runner and
// backs off (2 s, 4 s, ...).
func TestFailingCreateVMBacksOff(t *testing.T) {
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	srv.AddJob("acme/app", "j", []string{"linux"}, forge.StatusQueued)
	cpi := &recordingCPI{created: make(chan time.Time, 100000), failCreate: true}
	o, _, _, stop := benchOrchestrator(t, srv, 50*time.Millisecond, 50*time.Millisecond, cpi)
	defer stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		g := o.Groups()[0]
		if !g.BackoffUntil.IsZero() && strings.Contains(g.LastError, "no capacity") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no backoff after %d failed create_vm calls: %+v", cpi.creates(), g)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := cpi.creates(); n != 1 {
		t.Errorf("%d create_vm calls before backing off", n)
	}
	if rs, _ := o.Store().Active("g"); len(rs) != 0 {
		t.Errorf("failed spawns left rows: %+v", rs)
	}
}

// A CPI error naming a URL with secrets (an IaaS endpoint with a token in
// its query) is kept redacted wherever the daemon keeps it: the runner's
// row in the store (the CPI's create_vm failed and so did its list_vms,
// so the row keeps the error), the group's status, the recent errors.
func TestCPIErrorsAreKeptRedacted(t *testing.T) {
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	srv.AddJob("acme/app", "j", []string{"linux"}, forge.StatusQueued)
	cpi := &recordingCPI{created: make(chan time.Time, 100000), failWith: `POST "` + forgetest.CanaryURLAt("nova.example") + `": 500`}
	o, _, _, stop := benchOrchestrator(t, srv, 50*time.Millisecond, 50*time.Millisecond, cpi)
	defer stop()
	var rows []store.Runner
	waitFor(t, 10*time.Second, "a runner row keeping the CPI's error", func() bool {
		rows, _ = o.Store().All(10)
		return len(rows) > 0 && rows[0].LastError != "" && status(o, "g").LastError != ""
	})
	kept := map[string]string{"the runner's row": rows[0].LastError, "the group's status": status(o, "g").LastError}
	for _, e := range o.History().Errors() {
		kept["the recent errors"] += e.Message + "\n"
	}
	for what, text := range kept {
		noCanary(t, what, text)
		if !strings.Contains(text, "nova.example/keep-this-segment?token=<redacted>") {
			t.Errorf("%s lost where the error came from: %q", what, text)
		}
	}
}
