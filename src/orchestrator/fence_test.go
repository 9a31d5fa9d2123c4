package orchestrator

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// A process that may no longer act (its Lease renewed too long ago: it
// was frozen, then resumed) acts for no group and makes no side effect —
// no VM, no store write — however many jobs wait, and says why; once the
// fence lifts it acts again.
func TestFenceStopsEverySideEffect(t *testing.T) {
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	cpi := &vmCPI{vms: map[string]map[string]any{}, giteaURL: srv.URL}
	var fenced atomic.Bool
	o, _ := startOnGiteaWith(t, srv.URL, "sweep_interval: 100ms", `
  - {name: a, scope: org, org: acme, labels: [linux], max_active_runners: 4, stemcell: {cid: sc-1}, runner: {command: /bin/true}}`,
		Options{CPI: cpi, Fence: func() error {
			if fenced.Load() {
				return errors.New("the Lease was last renewed 9s ago")
			}
			return nil
		}})
	srv.AddJob("acme/app", "build", []string{"linux"}, "queued")
	eventually(t, 10*time.Second, "a runner while acting", func() bool { return cpi.made() == 1 })
	fenced.Store(true)
	eventually(t, 10*time.Second, "not acting, saying why", func() bool {
		s, _ := statusOf(o, "a")
		return !s.Acting && strings.Contains(s.LastError, "the Lease was last renewed 9s ago")
	})
	for range 3 {
		srv.AddJob("acme/app", "build", []string{"linux"}, "queued")
	}
	// Several passes later, still nothing made.
	s0, _ := statusOf(o, "a")
	eventually(t, 10*time.Second, "two more passes", func() bool {
		s, _ := statusOf(o, "a")
		return s.LastCheckTime.After(s0.LastCheckTime.Add(150 * time.Millisecond))
	})
	if n := cpi.made(); n != 1 {
		t.Errorf("%d VMs made while fenced, want none beyond the first", n-1)
	}
	if err := o.Store().Save(store.Runner{Name: "x", Group: "a"}); err == nil || !strings.Contains(err.Error(), "not acting") {
		t.Errorf("a store write while fenced: %v", err)
	}
	fenced.Store(false)
	eventually(t, 10*time.Second, "runners for the waiting jobs once the fence lifts", func() bool { return cpi.made() >= 2 })
}

// A group whose every create_vm fails (cloud properties the CPI refuses,
// say) backs off further at each failure — 2 s, 4 s, 8 s… — not 2 s over
// and over: the passes that start the next spawns do not end it.
func TestFailingSpawnsBackOffFurther(t *testing.T) {
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	cpi := &vmCPI{vms: map[string]map[string]any{}, giteaURL: "http://127.0.0.1:1"}
	o, _ := startOnGiteaWith(t, srv.URL, "sweep_interval: 100ms", `
  - {name: a, scope: org, org: acme, labels: [linux], max_active_runners: 1, stemcell: {cid: sc-1}, runner: {command: /bin/true}}`,
		Options{CPI: cpi})
	srv.AddJob("acme/app", "build", []string{"linux"}, "queued")
	eventually(t, 20*time.Second, "a backoff past 5 s", func() bool {
		s, _ := statusOf(o, "a")
		return s.BackoffUntil.Sub(s.LastCheckTime) > 5*time.Second
	})
}
