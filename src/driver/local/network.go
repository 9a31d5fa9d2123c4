package local

import (
	"context"
	"fmt"
	"net"
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
			a, err := netip.ParseAddr(n.IP)
			if err != nil {
				return nil, driver.Invalid("network %s: ip %q is not an IP address", name, n.IP)
			}
			if d.containers() {
				// The address is configured inside the VM: it must be
				// one of the bridge's, and held once.
				if err := d.usable(a); err != nil {
					return nil, driver.Invalid("network %s: ip %s: %v", name, n.IP, err)
				}
				if err := d.fitManual(name, a, &n); err != nil {
					return nil, err
				}
				need++
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
	// Fixed addresses first, so no dynamic one takes them.
	for name, n := range out {
		if n.Type == "manual" && n.IP != "" && d.containers() {
			if owner := table[n.IP]; owner != "" && owner != cid {
				return nil, fmt.Errorf("network %s: ip %s is held by vm %s", name, n.IP, owner)
			}
			table[n.IP] = cid
		}
	}
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
		d.log.Warn("releasing addresses failed", "vm", cid, "err", err)
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
		d.log.Warn("releasing addresses failed", "vm", cid, "err", err)
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

// fitManual keeps a manual network's netmask and gateway, as the manifest
// gives them (the agent and the VM's interface use them), when they fit
// the bridge: the subnet inside container.cidr, the gateway the host's
// bridge address (the only router there is). Missing ones are the
// bridge's.
func (d *Driver) fitManual(name string, a netip.Addr, n *driver.Network) error {
	bits := d.prefix.Bits()
	if n.Netmask != "" {
		m := net.ParseIP(n.Netmask).To4()
		ones, size := net.IPMask(m).Size()
		if m == nil || size != 32 {
			return driver.Invalid("networks.%s.netmask %q is not an IPv4 netmask", name, n.Netmask)
		}
		if ones < d.prefix.Bits() {
			return driver.Invalid("networks.%s.netmask %s: the subnet %s is wider than the vm network container.cidr %s",
				name, n.Netmask, netip.PrefixFrom(a, ones).Masked(), d.prefix)
		}
		bits = ones
	}
	if n.Gateway != "" && n.Gateway != d.gateway().String() {
		return driver.Invalid("networks.%s.gateway %s: VMs route through the host, %s on the bridge (container.cidr %s)",
			name, n.Gateway, d.gateway(), d.prefix)
	}
	if !netip.PrefixFrom(a, bits).Masked().Contains(d.gateway()) {
		return driver.Invalid("networks.%s: the subnet %s (netmask %s) does not hold the host's address %s, the vm's gateway",
			name, netip.PrefixFrom(a, bits).Masked(), n.Netmask, d.gateway())
	}
	n.Netmask, n.Gateway = netmask(netip.PrefixFrom(a, bits)), d.gateway().String()
	return nil
}

// usable: a VM address inside the bridge's network that is neither the
// network, the host (.1) nor the broadcast address.
func (d *Driver) usable(a netip.Addr) error {
	switch {
	case !d.prefix.Contains(a):
		return fmt.Errorf("outside the vm network %s", d.prefix)
	case a == d.prefix.Addr() || a == d.gateway():
		return fmt.Errorf("is the network's or the host's address in %s", d.prefix)
	case !d.prefix.Contains(a.Next()):
		return fmt.Errorf("is the broadcast address of %s", d.prefix)
	}
	return nil
}
