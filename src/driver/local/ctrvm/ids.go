package ctrvm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/driver/local/record"
	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/local/store"
	"github.com/runway-cpi/runway/src/lock"
)

// idsPerVM is one VM's range of host ids: 0..65535 inside (root, vcap,
// the jobs' users, nobody).
const idsPerVM = 1 << 16

// hostIDsDir holds the host-wide registry of container VMs' id ranges
// (idranges.json, under the lock idranges): every state dir on the host
// draws its VMs' ranges from it, so no two VMs share a host id whatever
// state dir or container.uid_base made them (two operators with the
// default base once shared ids, and one VM's pipe buffers used up the
// other operator's per-user limits). It outlives reboots, as the VMs do.
var hostIDsDir = "/var/lib/runway"

// idClaim is one VM's range in the registry.
type idClaim struct {
	Base  uint32 `json:"base"`
	State string `json:"state_dir"`
	VM    string `json:"vm"`
}

func (c idClaim) overlaps(base uint32) bool {
	return uint64(base) < uint64(c.Base)+idsPerVM && uint64(c.Base) < uint64(base)+idsPerVM
}

// idRegistry is the registry, read and written under its lock.
type idRegistry struct {
	path   string
	Claims []idClaim `json:"claims"`
}

// withIDs runs f on the registry under the host-wide lock and saves it.
func (v *VMs) withIDs(ctx context.Context, f func(r *idRegistry) error) error {
	if err := os.MkdirAll(hostIDsDir, 0o700); err != nil {
		return fmt.Errorf("the host's id registry: %w", err)
	}
	locks, err := lock.New(hostIDsDir, 30*time.Second, v.st.Locks.Logger)
	if err != nil {
		return err
	}
	unlock, err := locks.Lock(ctx, "idranges")
	if err != nil {
		return fmt.Errorf("the host's id registry: %w", err)
	}
	defer unlock()
	r := &idRegistry{path: filepath.Join(hostIDsDir, "idranges.json")}
	if err := record.Read(r.path, r); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("the host's id registry %s: %w", r.path, err)
	}
	if err := f(r); err != nil {
		return err
	}
	return record.Write(r.path, r)
}

// prune drops the claims of VMs that are gone: their state dir has no
// such VM (published or being created), or is gone itself.
func (r *idRegistry) prune(v *VMs) {
	r.Claims = slices.DeleteFunc(r.Claims, func(c idClaim) bool {
		if c.State == v.st.Root {
			return !v.st.OwnerAlive(c.VM)
		}
		for _, p := range []string{filepath.Join(c.State, "vms", ".creating-"+c.VM), filepath.Join(c.State, "vms", c.VM)} {
			if _, err := os.Lstat(p); err == nil || !errors.Is(err, fs.ErrNotExist) {
				return false
			}
		}
		return true
	})
}

// holder answers the claim, other than (state, vm)'s, whose range
// overlaps the one at base.
func (r *idRegistry) holder(base uint32, state, vm string) (idClaim, bool) {
	for _, c := range r.Claims {
		if c.overlaps(base) && (c.State != state || c.VM != vm) {
			return c, true
		}
	}
	return idClaim{}, false
}

// maxSlots is how many VM ranges fit above the base below 2^32-1.
func (v *VMs) maxSlots() int {
	return int((uint64(math.MaxUint32) - uint64(v.cfg.UIDBase)) / idsPerVM)
}

// allocateIDs gives cid the lowest range above container.uid_base that
// no VM of any state dir on the host holds.
func (v *VMs) allocateIDs(ctx context.Context, cid string) (storage.IDRange, error) {
	var got storage.IDRange
	err := v.withIDs(ctx, func(r *idRegistry) error {
		r.prune(v)
		v.registerEarlier(r)
		for _, c := range r.Claims {
			if c.State == v.st.Root && c.VM == cid {
				got = storage.IDRange{Base: c.Base, Size: idsPerVM}
				return nil
			}
		}
		for n := range v.maxSlots() {
			base := v.cfg.UIDBase + uint32(n)*idsPerVM
			if _, taken := r.holder(base, v.st.Root, cid); taken {
				continue
			}
			r.Claims = append(r.Claims, idClaim{Base: base, State: v.st.Root, VM: cid})
			got = storage.IDRange{Base: base, Size: idsPerVM}
			return nil
		}
		return fmt.Errorf("every one of the %d id ranges above container.uid_base %d is held by a vm on this host", v.maxSlots(), v.cfg.UIDBase)
	})
	return got, err
}

// registerEarlier brings the VMs this state dir made before the registry
// (<state_dir>/idranges.json, slot → VM) into it, saying which ones
// share ids with another state dir's (recreate one of them).
func (v *VMs) registerEarlier(r *idRegistry) {
	path := filepath.Join(v.st.Root, "idranges.json")
	table := map[string]string{}
	if record.Read(path, &table) != nil {
		return
	}
	for slot, vm := range table {
		n, err := strconv.Atoi(slot)
		if err != nil || !v.st.OwnerAlive(vm) {
			continue
		}
		base := v.cfg.UIDBase + uint32(n)*idsPerVM
		if rec, err := v.st.LoadVM(vm); err == nil && rec.IDs != nil {
			base = rec.IDs.Base
		}
		if other, taken := r.holder(base, v.st.Root, vm); taken {
			v.st.Log.Warn("a vm made before the host-wide id registry shares host ids with another state dir's vm: recreate one of them", "vm", vm, "other_state_dir", other.State, "other_vm", other.VM)
		}
		if !slices.ContainsFunc(r.Claims, func(c idClaim) bool { return c.State == v.st.Root && c.VM == vm }) {
			r.Claims = append(r.Claims, idClaim{Base: base, State: v.st.Root, VM: vm})
		}
	}
	_ = os.Remove(path)
}

// claimIDs makes sure VM rec's recorded range is its own before it starts
// again (the registry lost, or a VM made before it): refused by name when
// another VM holds ids of it.
func (v *VMs) claimIDs(ctx context.Context, rec *store.VM) error {
	return v.withIDs(ctx, func(r *idRegistry) error {
		r.prune(v)
		v.registerEarlier(r)
		if other, taken := r.holder(rec.IDs.Base, v.st.Root, rec.CID); taken {
			return fmt.Errorf("vm %s's host ids %d–%d are also vm %s's of state dir %s (made before ids were allocated host-wide): delete one of them and make it again (bosh recreate)",
				rec.CID, rec.IDs.Base, uint64(rec.IDs.Base)+idsPerVM-1, other.VM, other.State)
		}
		if !slices.ContainsFunc(r.Claims, func(c idClaim) bool { return c.State == v.st.Root && c.VM == rec.CID }) {
			r.Claims = append(r.Claims, idClaim{Base: rec.IDs.Base, State: v.st.Root, VM: rec.CID})
		}
		return nil
	})
}

// releaseIDs frees cid's range.
func (v *VMs) releaseIDs(ctx context.Context, cid string) {
	err := v.withIDs(ctx, func(r *idRegistry) error {
		r.Claims = slices.DeleteFunc(r.Claims, func(c idClaim) bool { return c.State == v.st.Root && c.VM == cid })
		return nil
	})
	if err != nil {
		v.st.Log.Warn("releasing the vm's id range failed", "vm", cid, "err", err)
	}
}

// hostIDFiles are where a host hands out ids: its users and groups, and
// the subordinate ranges other container tools map user namespaces to.
var hostIDFiles = []string{"/etc/passwd", "/etc/group", "/etc/subuid", "/etc/subgid"}

// checkHostIDs refuses a uid_base at or below which the host has given
// out ids (a user, a group, another tool's subordinate range): a VM would
// share them.
func checkHostIDs(base uint32, files map[string][]byte) error {
	for _, name := range hostIDFiles {
		for n, line := range strings.Split(string(files[name]), "\n") {
			f := strings.Split(strings.TrimSpace(line), ":")
			var lo, hi uint64
			switch {
			case (name == "/etc/passwd" || name == "/etc/group") && len(f) >= 3:
				v, err := strconv.ParseUint(f[2], 10, 32)
				if err != nil {
					continue
				}
				lo, hi = v, v
			case (name == "/etc/subuid" || name == "/etc/subgid") && len(f) == 3:
				start, err1 := strconv.ParseUint(f[1], 10, 32)
				count, err2 := strconv.ParseUint(f[2], 10, 32)
				if err1 != nil || err2 != nil || count == 0 {
					continue
				}
				lo, hi = start, start+count-1
			default:
				continue
			}
			if hi >= uint64(base) {
				return fmt.Errorf("local: container.uid_base: %d: VMs take the host's ids from there up, but %s line %d (%s) gives out ids %d–%d; choose a base above %d",
					base, name, n+1, f[0], lo, hi, hi)
			}
		}
	}
	return nil
}

// readHostIDFiles reads hostIDFiles (a missing one is empty).
func readHostIDFiles() map[string][]byte {
	out := map[string][]byte{}
	for _, name := range hostIDFiles {
		out[name], _ = os.ReadFile(name)
	}
	return out
}
