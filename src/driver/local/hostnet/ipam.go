package hostnet

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/record"
	"github.com/runway-cpi/runway/src/lock"
)

// IPAM is the address table both isolation modes draw from: ipam.json
// maps an address to the VM that holds it. It is the driver's one shared
// state file and is only touched under the "state-ipam" lock.
type IPAM struct {
	// Path of the table (ipam.json); Prefix the addresses given out.
	Path   string
	Prefix netip.Prefix
	// Bridge: container mode, where a manual address is configured inside
	// the VM and must be one of the bridge's; nil for process mode.
	Bridge *Bridge
	Locks  *lock.Locker
	// Alive says whether a VM still holds its addresses: a create killed
	// half-way leaves entries only a dead owner explains. Live, when set,
	// answers the VMs that look alive in one go (one directory read,
	// not two stats a VM); Alive decides for the others.
	Alive func(cid string) bool
	Live  func() map[string]bool
}

// Allocate answers the networks hash with addresses: manual networks keep
// the address the caller assigned; others get a free loopback address.
func (a *IPAM) Allocate(ctx context.Context, cid string, in driver.Networks) (driver.Networks, error) {
	out := driver.Networks{}
	need := 0
	for name, n := range in {
		if n.Type == "manual" && n.IP != "" {
			ip, err := netip.ParseAddr(n.IP)
			if err != nil {
				return nil, driver.Invalid("network %s: ip %q is not an IP address", name, n.IP)
			}
			if a.Bridge != nil {
				// The address is configured inside the VM: it must be
				// one of the bridge's, and held once.
				if err := a.Bridge.usable(ip); err != nil {
					return nil, driver.Invalid("network %s: ip %s: %v", name, n.IP, err)
				}
				if err := a.Bridge.fitManual(name, ip, &n); err != nil {
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
	unlock, err := a.Locks.Lock(ctx, "state-ipam")
	if err != nil {
		return nil, err
	}
	defer unlock()
	table := map[string]string{}
	if err := record.Read(a.Path, &table); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	var live map[string]bool
	if a.Live != nil {
		live = a.Live()
	}
	for ip, owner := range table {
		if !live[owner] && !a.Alive(owner) {
			delete(table, ip) // left by a create that was killed
		}
	}
	// .0 is the network, .1 the gateway.
	addr := a.Prefix.Addr().Next().Next()
	// Fixed addresses first, so no dynamic one takes them.
	for name, n := range out {
		if n.Type == "manual" && n.IP != "" && a.Bridge != nil {
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
		for ; a.Prefix.Contains(addr) && table[addr.String()] != ""; addr = addr.Next() {
		}
		if !a.Prefix.Contains(addr.Next()) { // keep the broadcast address free
			return nil, fmt.Errorf("loopback range %s exhausted", a.Prefix)
		}
		table[addr.String()] = cid
		n.IP = addr.String()
		n.Netmask = netmask(a.Prefix)
		n.Gateway = a.Prefix.Addr().Next().String()
		out[name] = n
		addr = addr.Next()
	}
	return out, record.Write(a.Path, table)
}

// Release frees cid's addresses.
func (a *IPAM) Release(ctx context.Context, cid string) error {
	unlock, err := a.Locks.Lock(ctx, "state-ipam")
	if err != nil {
		return err
	}
	defer unlock()
	table := map[string]string{}
	if err := record.Read(a.Path, &table); err != nil {
		return nil
	}
	for ip, owner := range table {
		if owner == cid {
			delete(table, ip)
		}
	}
	return record.Write(a.Path, table)
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
func (b *Bridge) fitManual(name string, a netip.Addr, n *driver.Network) error {
	bits := b.Prefix.Bits()
	if n.Netmask != "" {
		m := net.ParseIP(n.Netmask).To4()
		ones, size := net.IPMask(m).Size()
		if m == nil || size != 32 {
			return driver.Invalid("networks.%s.netmask %q is not an IPv4 netmask", name, n.Netmask)
		}
		if ones < b.Prefix.Bits() {
			return driver.Invalid("networks.%s.netmask %s: the subnet %s is wider than the vm network container.cidr %s",
				name, n.Netmask, netip.PrefixFrom(a, ones).Masked(), b.Prefix)
		}
		bits = ones
	}
	if n.Gateway != "" && n.Gateway != b.Gateway().String() {
		return driver.Invalid("networks.%s.gateway %s: VMs route through the host, %s on the bridge (container.cidr %s)",
			name, n.Gateway, b.Gateway(), b.Prefix)
	}
	if !netip.PrefixFrom(a, bits).Masked().Contains(b.Gateway()) {
		return driver.Invalid("networks.%s: the subnet %s (netmask %s) does not hold the host's address %s, the vm's gateway",
			name, netip.PrefixFrom(a, bits).Masked(), n.Netmask, b.Gateway())
	}
	n.Netmask, n.Gateway = netmask(netip.PrefixFrom(a, bits)), b.Gateway().String()
	return nil
}

// usable: a VM address inside the bridge's network that is neither the
// network, the host (.1) nor the broadcast address.
func (b *Bridge) usable(a netip.Addr) error {
	switch {
	case !b.Prefix.Contains(a):
		return fmt.Errorf("outside the vm network %s", b.Prefix)
	case a == b.Prefix.Addr() || a == b.Gateway():
		return fmt.Errorf("is the network's or the host's address in %s", b.Prefix)
	case !b.Prefix.Contains(a.Next()):
		return fmt.Errorf("is the broadcast address of %s", b.Prefix)
	}
	return nil
}
