package local

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/runway-cpi/runway/src/driver"
)

// ipam.json maps loopback address → owning VM CID. It is the driver's one
// shared state file and is only touched under the "state-ipam" lock.
func (d *Driver) ipamPath() string { return filepath.Join(d.root, "ipam.json") }

// allocate answers the networks hash with addresses: manual networks keep
// the address the caller assigned; others get a free loopback address.
func (d *Driver) allocate(ctx context.Context, cid string, in driver.Networks) (driver.Networks, error) {
	out := driver.Networks{}
	need := 0
	for name, n := range in {
		if n.Type == "manual" && n.IP != "" {
			if _, err := netip.ParseAddr(n.IP); err != nil {
				return nil, driver.Invalid("network %s: ip %q is not an IP address", name, n.IP)
			}
		} else {
			need++
		}
		out[name] = n
	}
	if need == 0 {
		return out, nil
	}
	unlock, err := d.locks.Lock(ctx, "state-ipam")
	if err != nil {
		return nil, err
	}
	defer unlock()
	table := map[string]string{}
	if err := readJSON(d.ipamPath(), &table); err != nil && !isNotExist(err) {
		return nil, err
	}
	for ip, owner := range table {
		if !d.ownerAlive(owner) {
			delete(table, ip) // left by a create that was killed
		}
	}
	// .0 is the network, .1 the gateway.
	addr := d.prefix.Addr().Next().Next()
	for name, n := range out {
		if n.Type == "manual" && n.IP != "" {
			continue
		}
		for ; d.prefix.Contains(addr) && table[addr.String()] != ""; addr = addr.Next() {
		}
		if !d.prefix.Contains(addr.Next()) { // keep the broadcast address free
			return nil, fmt.Errorf("loopback range %s exhausted", d.prefix)
		}
		table[addr.String()] = cid
		n.IP = addr.String()
		n.Netmask = netmask(d.prefix)
		n.Gateway = d.prefix.Addr().Next().String()
		out[name] = n
		addr = addr.Next()
	}
	return out, writeJSON(d.ipamPath(), table)
}

// release frees cid's addresses.
func (d *Driver) release(ctx context.Context, cid string) {
	unlock, err := d.locks.Lock(ctx, "state-ipam")
	if err != nil {
		d.log.Warn("local", "releasing addresses of %s: %v", cid, err)
		return
	}
	defer unlock()
	table := map[string]string{}
	if err := readJSON(d.ipamPath(), &table); err != nil {
		return
	}
	for ip, owner := range table {
		if owner == cid {
			delete(table, ip)
		}
	}
	if err := writeJSON(d.ipamPath(), table); err != nil {
		d.log.Warn("local", "releasing addresses of %s: %v", cid, err)
	}
}

// ownerAlive: a VM being created or existing still owns its addresses.
// The checks follow the publishing rename (.creating-<cid> → <cid>): looked
// at in the other order, a VM published between the two looks dead.
func (d *Driver) ownerAlive(cid string) bool {
	for _, p := range []string{filepath.Join(d.root, "vms", ".creating-"+cid), d.path(vms, cid)} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

func netmask(p netip.Prefix) string {
	m := uint32(0xffffffff) << (32 - p.Bits())
	return fmt.Sprintf("%d.%d.%d.%d", m>>24, m>>16&0xff, m>>8&0xff, m&0xff)
}
