package hostnet

import (
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
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

// guardElements are one VM port's elements in the table's sets.
func guardElements(table, port string, mac net.HardwareAddr, addrs []string) []string {
	lines := []string{
		fmt.Sprintf("element bridge %s vms { %q }", table, port),
		fmt.Sprintf("element bridge %s ports { %q . %s }", table, port, mac),
	}
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a); err == nil {
			a = p.Addr().String()
		}
		lines = append(lines, fmt.Sprintf("element bridge %s addrs { %q . %s }", table, port, a))
	}
	return lines
}

// guard lets port send as mac and addrs only, making the table first if
// it is gone (a host whose ruleset was flushed).
func guard(ctx context.Context, table, port string, mac net.HardwareAddr, addrs []string) error {
	var b strings.Builder
	for _, l := range guardElements(table, port, mac, addrs) {
		b.WriteString("add " + l + "\n")
	}
	if err := nft(ctx, b.String()); err == nil {
		return nil
	}
	if err := ensureGuard(ctx, table); err != nil {
		return fmt.Errorf("the bridge ports' guard: %w", err)
	}
	if err := nft(ctx, b.String()); err != nil {
		return fmt.Errorf("guarding the vm's bridge port: %w", err)
	}
	return nil
}

// Unguard removes a VM port's elements, whether or not they are there
// (each is added, then deleted, in one transaction); with no table there
// is nothing to remove.
func Unguard(ctx context.Context, table, port string, mac net.HardwareAddr, addrs []string) error {
	var b strings.Builder
	for _, l := range guardElements(table, port, mac, addrs) {
		b.WriteString("add " + l + "\ndelete " + l + "\n")
	}
	if err := nft(ctx, b.String()); err != nil {
		list := exec.CommandContext(ctx, "nft", "list", "table", "bridge", table)
		list.Env = []string{"PATH=" + toolPath}
		if list.Run() != nil {
			return nil // no table, no elements
		}
		return err
	}
	return nil
}
