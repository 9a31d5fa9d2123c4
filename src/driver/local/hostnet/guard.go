package hostnet

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os/exec"
	"strings"

	"github.com/google/nftables"

	"github.com/runway-cpi/runway/src/driver/local/record"
	"github.com/runway-cpi/runway/src/lock"
)

// The port guard: each VM's bridge port may send only frames from its own
// hardware address, IPv4 packets from its own addresses and ARP that
// names both — nothing else (no other address, no IPv6, no other
// ethertype). An nftables table of the bridge family per state dir, its
// ports and their addresses in sets: one lookup per frame whatever the
// number of VMs, and a VM added or removed is one set element each.

// guardSets are the ports and their addresses; guardRules the chain's
// rules, checked on frames as they enter a port (prerouting: before the
// bridge learns a hardware address).
const (
	guardSets = `
	set vms { type ifname; }
	set ports { type ifname . ether_addr; }
	set addrs { type ifname . ipv4_addr; }
`
	guardRules = `
		iifname != @vms accept
		iifname . ether saddr != @ports drop
		ether type arp iifname . arp saddr ether != @ports drop
		ether type arp iifname . arp saddr ip != @addrs drop
		ether type ip iifname . ip saddr != @addrs drop
		ether type != { ip, arp } drop
`
)

// GuardTable is the table of the state dir whose key is key.
func GuardTable(key string) string { return "runway_" + key }

// VMMAC is a VM's hardware address (locally administered, from the state
// dir's key and its CID): the only one its port may send from.
func VMMAC(key, cid string) net.HardwareAddr {
	sum := sha256.Sum256([]byte(key + "\x01" + cid))
	return append(net.HardwareAddr{0x02}, sum[:5]...)
}

// nft runs nft with a script on stdin.
func nft(ctx context.Context, script string) error {
	cmd := exec.CommandContext(ctx, "nft", "-f", "-")
	cmd.Env = []string{"PATH=" + toolPath}
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// ensureGuard makes the table, or puts its rules back, in one nft
// transaction: made twice at once (bin/cpi and a supervisor may both),
// the rules are still there once, and the sets keep their elements.
func ensureGuard(ctx context.Context, table string) error {
	return nft(ctx, "add table bridge "+table+"\n"+
		"table bridge "+table+" {"+guardSets+"}\n"+
		"add chain bridge "+table+" from_vms { type filter hook prerouting priority -200; policy accept; }\n"+
		"flush chain bridge "+table+" from_vms\n"+
		"table bridge "+table+" { chain from_vms {"+guardRules+"}\n}\n")
}

// portKeys are one VM port's set keys: its name (IFNAMSIZ bytes, NUL
// padded, as nft matches iifname), with its MAC, and with each address;
// each part of a concatenation padded to 4 bytes.
func portKeys(port string, mac net.HardwareAddr, addrs []string) (vms, ports []byte, ips [][]byte) {
	name := make([]byte, 16)
	copy(name, port)
	ports = append(append(append([]byte{}, name...), mac...), 0, 0)
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a); err == nil {
			a = p.Addr().String()
		}
		if ip, err := netip.ParseAddr(a); err == nil && ip.Is4() {
			v4 := ip.As4()
			ips = append(ips, append(append([]byte{}, name...), v4[:]...))
		}
	}
	return name, ports, ips
}

// port is one VM port's elements.
type port struct {
	Name  string   `json:"port"`
	MAC   string   `json:"mac"`
	Addrs []string `json:"addrs"`
}

// elements sends one transaction changing ports' elements: add, or
// remove (an add then a delete of each: gone whether or not it was
// there), through netlink — no process per VM.
func elements(table string, ps []port, remove bool) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Family: nftables.TableFamilyBridge, Name: table}
	keys := map[string][][]byte{}
	for _, p := range ps {
		mac, err := net.ParseMAC(p.MAC)
		if err != nil {
			return err
		}
		vms, ports, ips := portKeys(p.Name, mac, p.Addrs)
		keys["vms"] = append(keys["vms"], vms)
		keys["ports"] = append(keys["ports"], ports)
		keys["addrs"] = append(keys["addrs"], ips...)
	}
	for _, name := range []string{"vms", "ports", "addrs"} {
		s := &nftables.Set{Table: t, Name: name}
		var elems []nftables.SetElement
		for _, k := range keys[name] {
			elems = append(elems, nftables.SetElement{Key: k})
		}
		if len(elems) == 0 {
			continue
		}
		if err := c.SetAddElements(s, elems); err != nil {
			return err
		}
		if remove {
			if err := c.SetDeleteElements(s, elems); err != nil {
				return err
			}
		}
	}
	return c.Flush()
}

// guard lets port send as mac and addrs only, making the table first if
// it is gone (a host whose ruleset was flushed).
func guard(ctx context.Context, table, name string, mac net.HardwareAddr, addrs []string) error {
	p := []port{{Name: name, MAC: mac.String(), Addrs: addrs}}
	if err := elements(table, p, false); err == nil {
		return nil
	}
	if err := ensureGuard(ctx, table); err != nil {
		return fmt.Errorf("the bridge ports' guard: %w", err)
	}
	if err := elements(table, p, false); err != nil {
		return fmt.Errorf("guarding the vm's bridge port: %w", err)
	}
	return nil
}

// retireBatch: how many deleted VMs' ports wait before their elements go.
// Every transaction that removes elements waits for an RCU grace period
// in the kernel (8-16 ms here), whatever it removes; a port name is never
// used again (each VM instance draws its own), so a dead port's elements
// let nothing through meanwhile.
const retireBatch = 32

// Retired keeps the ports of deleted VMs until their elements are
// removed, in batches: Path (a JSON list) under the state-guard lock.
type Retired struct {
	Path, Table string
	Locks       *lock.Locker
}

// Retire adds a deleted VM's port; when retireBatch are waiting, or when
// last (no VM is left), every waiting port's elements are removed in one
// transaction.
func (r Retired) Retire(ctx context.Context, name string, mac net.HardwareAddr, addrs []string, last bool) error {
	unlock, err := r.Locks.Lock(ctx, "state-guard")
	if err != nil {
		return err
	}
	defer unlock()
	var waiting []port
	if err := record.Read(r.Path, &waiting); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	waiting = append(waiting, port{Name: name, MAC: mac.String(), Addrs: addrs})
	if len(waiting) >= retireBatch || last {
		if err := elements(r.Table, waiting, true); err != nil {
			list := exec.CommandContext(ctx, "nft", "list", "table", "bridge", r.Table)
			list.Env = []string{"PATH=" + toolPath}
			if list.Run() == nil {
				return fmt.Errorf("removing %d retired ports from the guard: %w", len(waiting), err)
			}
			// No table, no elements.
		}
		waiting = nil
	}
	return record.Write(r.Path, waiting)
}
