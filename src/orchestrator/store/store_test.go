package store

import (
	"path/filepath"
	"testing"
	"time"
)

func TestRunnersSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "runway.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.UnixMilli(time.Now().UnixMilli())
	r := Runner{Name: "g-1", Group: "g", AgentID: "g-1", State: Spawning, TriggerJob: 42, JobRepo: "acme/app", CreatedAt: now, StateAt: now}
	if err := s.Save(r); err != nil {
		t.Fatal(err)
	}
	r.State, r.VMCID = Idle, "vm-1"
	if err := s.Save(r); err != nil {
		t.Fatal(err)
	}
	if err := s.Save(Runner{Name: "g-2", Group: "g", AgentID: "g-2", State: Deleted, CreatedAt: now, StateAt: now.Add(-48 * time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := s.SetDrained("g", true); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Get("g-1")
	if err != nil || got != r {
		t.Fatalf("after reopen: %+v (%v), want %+v", got, err, r)
	}
	active, _ := s.Active("g")
	if len(active) != 1 || active[0].Name != "g-1" {
		t.Errorf("active %+v", active)
	}
	if d, _ := s.Drained("g"); !d {
		t.Error("drain flag lost")
	}
	if n, _ := s.Purge(now.Add(-24 * time.Hour)); n != 1 {
		t.Errorf("purged %d", n)
	}
	if _, err := s.Get("g-2"); err != ErrNotFound {
		t.Errorf("purged row: %v", err)
	}
}
