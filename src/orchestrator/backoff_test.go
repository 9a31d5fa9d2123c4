package orchestrator

import (
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/forgetest"
)

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
