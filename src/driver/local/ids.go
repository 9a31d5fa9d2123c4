package local

import (
	"context"
	"fmt"
	"math"
	"strconv"

	"github.com/runway-cpi/runway/src/driver/local/storage"
)

// idsPerVM is one VM's range of host ids: 0..65535 inside (root, vcap,
// the jobs' users, nobody).
const idsPerVM = 1 << 16

// idRangesPath is idranges.json: a container VM's slot → its CID. Slot n
// maps the VM's ids onto host ids container.uid_base + n*65536 onward, so
// no two VMs share a host id and none is the host's. Touched only under
// the "state-ids" lock.
func (d *Driver) idRangesPath() string { return d.root + "/idranges.json" }

// maxSlots is how many VM ranges fit above the base below 2^32-1.
func (d *Driver) maxSlots() int {
	return int((uint64(math.MaxUint32) - uint64(d.cfg.Container.UIDBase)) / idsPerVM)
}

// allocateIDs gives cid the lowest free range.
func (d *Driver) allocateIDs(ctx context.Context, cid string) (storage.IDRange, error) {
	unlock, err := d.locks.Lock(ctx, "state-ids")
	if err != nil {
		return storage.IDRange{}, err
	}
	defer unlock()
	table := map[string]string{}
	if err := readJSON(d.idRangesPath(), &table); err != nil && !isNotExist(err) {
		return storage.IDRange{}, err
	}
	live := d.liveVMs()
	for slot, owner := range table {
		if owner != cid && !live[owner] && !d.ownerAlive(owner) {
			delete(table, slot) // left by a create that was killed
		}
	}
	for n := range d.maxSlots() {
		key := strconv.Itoa(n)
		if owner, taken := table[key]; taken && owner != cid {
			continue
		}
		table[key] = cid
		if err := writeJSON(d.idRangesPath(), table); err != nil {
			return storage.IDRange{}, err
		}
		return d.idRange(n), nil
	}
	return storage.IDRange{}, fmt.Errorf("every one of the %d id ranges above container.uid_base %d is held by a vm", d.maxSlots(), d.cfg.Container.UIDBase)
}

// idRange is slot n's range.
func (d *Driver) idRange(n int) storage.IDRange {
	return storage.IDRange{Base: d.cfg.Container.UIDBase + uint32(n)*idsPerVM, Size: idsPerVM}
}

// releaseIDs frees cid's range.
func (d *Driver) releaseIDs(ctx context.Context, cid string) {
	unlock, err := d.locks.Lock(ctx, "state-ids")
	if err != nil {
		d.log.Warn("releasing the vm's id range failed", "vm", cid, "err", err)
		return
	}
	defer unlock()
	table := map[string]string{}
	if err := readJSON(d.idRangesPath(), &table); err != nil {
		return
	}
	for slot, owner := range table {
		if owner == cid {
			delete(table, slot)
		}
	}
	if err := writeJSON(d.idRangesPath(), table); err != nil {
		d.log.Warn("releasing the vm's id range failed", "vm", cid, "err", err)
	}
}
