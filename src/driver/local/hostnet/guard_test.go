package hostnet

import (
	"context"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/testkit/netns"
)

// The guard's table made again (a supervisor and bin/cpi at once, or a
// host whose ruleset was flushed half-way) keeps its rules once and its
// ports' elements; a port removed twice is no error.
func TestGuardTableIsMadeOnceAndKeepsItsPorts(t *testing.T) {
	ns := netns.Add(t, "rwguard")
	ctx, table := context.Background(), GuardTable("test")
	mac, _ := net.ParseMAC("02:00:00:00:00:01")
	list := func() string {
		out, err := exec.Command("nsenter", "--net=/run/netns/"+ns, "nft", "list", "table", "bridge", table).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %s", err, out)
		}
		return string(out)
	}
	err := netns.Do(ns, func() {
		if err := guard(ctx, table, "rw000000000001", mac, []string{"10.0.0.2/24"}); err != nil {
			t.Fatal(err)
		}
		for range 2 {
			if err := ensureGuard(ctx, table); err != nil {
				t.Fatal(err)
			}
		}
		got := list()
		if n := strings.Count(got, "drop"); n != 5 {
			t.Errorf("%d drop rules after making the table three times:\n%s", n, got)
		}
		if !strings.Contains(got, `"rw000000000001" . 02:00:00:00:00:01`) || !strings.Contains(got, `"rw000000000001" . 10.0.0.2`) {
			t.Errorf("the port's elements are gone:\n%s", got)
		}
		// A deleted VM's port waits for the batch (its name is never used
		// again); the last VM's deletion takes every waiting one out.
		locks, err := lock.New(t.TempDir(), time.Minute, nil)
		if err != nil {
			t.Fatal(err)
		}
		r := Retired{Path: filepath.Join(t.TempDir(), "retired.json"), Table: table, Locks: locks}
		if err := guard(ctx, table, "rw000000000002", mac, []string{"10.0.0.3/24"}); err != nil {
			t.Fatal(err)
		}
		if err := r.Retire(ctx, "rw000000000001", mac, []string{"10.0.0.2"}, false); err != nil {
			t.Fatal(err)
		}
		if got := list(); !strings.Contains(got, `"rw000000000001"`) {
			t.Errorf("a retired port's elements went before their batch:\n%s", got)
		}
		if err := r.Retire(ctx, "rw000000000002", mac, []string{"10.0.0.3"}, true); err != nil {
			t.Fatal(err)
		}
		if got := list(); strings.Contains(got, "elements") {
			t.Errorf("elements left after the last port was retired:\n%s", got)
		}
		// Made again, the batch may hold ports whose elements are gone.
		if err := r.Retire(ctx, "rw000000000001", mac, []string{"10.0.0.2"}, true); err != nil {
			t.Fatal(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}
