package controller

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/testkit/kubeyaml"
)

// A replica that may no longer act (its Lease renewed too long ago)
// reconciles nothing: no group handed to the engine, no status written,
// however often its objects come up; once it may act again, it does.
func TestFencedControllerWritesNothing(t *testing.T) {
	f := newFakeCluster(t, SecretAccess{Names: []string{"gitea-auth-token", "gitea-registration-token"}})
	eng := &fakeEngine{states: map[string]GroupState{}}
	var fenced atomic.Bool
	var asked atomic.Int64
	fenced.Store(true)
	f.startWith(t, eng, func(o *Options) {
		o.Fence = func() error {
			asked.Add(1)
			if fenced.Load() {
				return errors.New("the Lease was last renewed 9s ago")
			}
			return nil
		}
	})
	for _, u := range kubeyaml.Read(t, "testdata/seed-001-runnergroup.yaml") {
		f.create(t, u)
	}
	waitFor(t, 10*time.Second, "the object come up fenced, several times", func() bool { return asked.Load() >= 3 })
	if _, _, ok := eng.group(engineName(kindSeed, f.ns, "acme-linux")); ok {
		t.Error("handed to the engine while fenced")
	}
	if c := f.ready(gvrs[kindSeed], "acme-linux"); c.Reason != "" {
		t.Errorf("a status written while fenced: %+v", c)
	}
	fenced.Store(false)
	waitFor(t, 10*time.Second, "handed over once the fence lifts", func() bool {
		_, _, ok := eng.group(engineName(kindSeed, f.ns, "acme-linux"))
		return ok
	})
}
