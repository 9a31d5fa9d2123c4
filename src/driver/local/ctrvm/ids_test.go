package ctrvm

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/driver/local/record"
	"github.com/runway-cpi/runway/src/driver/local/store"
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/logging"
)

// idDriver is a container-mode driver's id allocation alone: its state
// dir, a VM directory for each cid it allocates (as create_vm has).
func idDriver(t *testing.T, base uint32) *VMs {
	t.Helper()
	root := filepath.Join(t.TempDir(), "state")
	locks, err := lock.New(filepath.Join(root, "locks"), 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return &VMs{st: &store.Store{Root: root, Locks: locks, Log: logging.Fields{Logger: logging.Discard()}},
		cfg: Config{UIDBase: base}}
}

func (v *VMs) testVM(t *testing.T, cid string) {
	t.Helper()
	if err := os.MkdirAll(v.st.Dir(store.VMs, cid), 0o700); err != nil {
		t.Fatal(err)
	}
}

// Two state dirs with the same uid_base: each VM's range is its own on
// the host; a range comes back once its VM (or its whole state dir) is
// gone.
func TestIDRangesAreAllocatedHostWide(t *testing.T) {
	hostIDsDir = t.TempDir()
	ctx := context.Background()
	a, b := idDriver(t, DefaultUIDBase), idDriver(t, DefaultUIDBase)
	taken := map[uint32]string{}
	for i, d := range []*VMs{a, b, a, b} {
		cid := "vm-" + string(rune('a'+i))
		d.testVM(t, cid)
		r, err := d.allocateIDs(ctx, cid)
		if err != nil {
			t.Fatal(err)
		}
		if r.Base < DefaultUIDBase || r.Size != idsPerVM || (r.Base-DefaultUIDBase)%idsPerVM != 0 {
			t.Fatalf("range %+v", r)
		}
		if other, dup := taken[r.Base]; dup {
			t.Fatalf("%s got %s's range %d", cid, other, r.Base)
		}
		taken[r.Base] = cid
		again, err := d.allocateIDs(ctx, cid)
		if err != nil || again != r {
			t.Errorf("%s asked again: %+v %v, want %+v", cid, again, err, r)
		}
	}
	// A base between two of a's slots overlaps both: c gets none of them.
	c := idDriver(t, DefaultUIDBase+idsPerVM/2)
	c.testVM(t, "vm-c")
	r, err := c.allocateIDs(ctx, "vm-c")
	if err != nil {
		t.Fatal(err)
	}
	for base := range taken {
		if uint64(r.Base) < uint64(base)+idsPerVM && uint64(base) < uint64(r.Base)+idsPerVM {
			t.Errorf("vm-c's range %d overlaps %s's %d", r.Base, taken[base], base)
		}
	}
	// Released, and gone with its state dir: the lowest comes back.
	a.releaseIDs(ctx, "vm-a")
	if err := os.RemoveAll(filepath.Dir(b.st.Root)); err != nil {
		t.Fatal(err)
	}
	d := idDriver(t, DefaultUIDBase)
	d.testVM(t, "vm-d")
	if r, err := d.allocateIDs(ctx, "vm-d"); err != nil || r.Base != DefaultUIDBase {
		t.Errorf("after the first range was freed: %+v %v", r, err)
	}
}

// A VM made before the registry comes into it; starting one whose range
// another state dir's VM holds is refused naming both.
func TestEarlierVMsJoinTheRegistry(t *testing.T) {
	hostIDsDir = t.TempDir()
	ctx := context.Background()
	old, nu := idDriver(t, DefaultUIDBase), idDriver(t, DefaultUIDBase)
	old.testVM(t, "vm-old")
	if err := record.Write(filepath.Join(old.st.Root, "idranges.json"), map[string]string{"0": "vm-old"}); err != nil {
		t.Fatal(err)
	}
	nu.testVM(t, "vm-new")
	r, err := nu.allocateIDs(ctx, "vm-new") // before old's state dir is seen
	if err != nil || r.Base != DefaultUIDBase {
		t.Fatalf("%+v %v", r, err)
	}
	rec := &store.VM{CID: "vm-old", IDs: &r}
	err = old.claimIDs(ctx, rec)
	if err == nil || !strings.Contains(err.Error(), "vm-new") || !strings.Contains(err.Error(), nu.st.Root) {
		t.Errorf("a shared range was not refused by name: %v", err)
	}
	old.testVM(t, "vm-other")
	if r, err := old.allocateIDs(ctx, "vm-other"); err != nil || r.Base == DefaultUIDBase {
		t.Errorf("vm-other: %+v %v", r, err)
	}
	if _, err := os.Stat(filepath.Join(old.st.Root, "idranges.json")); !os.IsNotExist(err) {
		t.Errorf("the state dir's own table is left: %v", err)
	}
}

func TestHostIDsAreRefusedByName(t *testing.T) {
	files := map[string][]byte{
		"/etc/passwd": []byte("root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/usr/sbin/nologin\n"),
		"/etc/group":  []byte("root:x:0:\n"),
		"/etc/subuid": []byte("alice:100000:65536\n"),
		"/etc/subgid": []byte("alice:100000:65536\n"),
	}
	if err := checkHostIDs(DefaultUIDBase, files); err != nil {
		t.Errorf("a base above every host id: %v", err)
	}
	err := checkHostIDs(150000, files)
	if err == nil || !strings.Contains(err.Error(), "container.uid_base") || !strings.Contains(err.Error(), "/etc/subuid line 1 (alice)") {
		t.Errorf("a base inside alice's subordinate ids: %v", err)
	}
	files["/etc/passwd"] = append(files["/etc/passwd"], "svc:x:1073741900:100::/:/bin/false\n"...)
	if err := checkHostIDs(DefaultUIDBase, files); err == nil || !strings.Contains(err.Error(), "/etc/passwd line 3 (svc)") {
		t.Errorf("a user above the base: %v", err)
	}
}
