package orchestrator

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/forgetest"
	"github.com/runway-cpi/runway/src/testkit/pgtest"
)

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
	var reps []*Orchestrator
	var urls []string
	for i := 0; i < 3; i++ {
		o, _, web, stop := benchOrchestrator(t, srv, time.Hour, time.Hour, cpi, "store: postgres", "postgres: {dsn_file: "+dsnFile+"}")
		defer stop()
		reps, urls = append(reps, o), append(urls, web.URL)
	}
	acting := func() []int {
		var out []int
		for i, o := range reps {
			if o.group("g").Status().Acting {
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
	if err := reps[standby].SetDrained("g", true); err != nil {
		t.Fatal(err)
	}
	leader := reps[acting()[0]]
	for deadline := time.Now().Add(10 * time.Second); !leader.group("g").isDrained(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the acting replica did not learn of the drain sent to a standby")
		}
	}
	queued := time.Now()
	srv.AddJob("acme/app", "j2", []string{"linux"}, forge.StatusQueued)
	// A pass that started after the job was queued lists it: wait for one,
	// then count what the passes decided (intent rows come before spawns).
	for deadline := time.Now().Add(10 * time.Second); !leader.group("g").Status().LastCheckTime.After(queued); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no pass of the acting replica after the second delivery")
		}
	}
	// Every runner ever made (the drain also retires the first one).
	rows, err := leader.store.All(100)
	if err != nil || len(rows) != 1 {
		t.Errorf("%d runners (%v), want 1: the job queued after the drain got one", len(rows), err)
	}
}
