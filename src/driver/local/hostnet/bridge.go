// Package hostnet is the host side of container VMs' network: the bridge
// (its address, hardware address and firewall), each VM's veth, and the
// address table both isolation modes draw from.
package hostnet

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"

	"github.com/runway-cpi/runway/src/driver/local/record"
	"github.com/runway-cpi/runway/src/lock"
)

// toolPath is the PATH ip, iptables and nsenter run with.
const toolPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Bridge is one driver's (one state dir's) VM network.
type Bridge struct {
	// Name of the bridge interface; Prefix its network (.1 the host).
	Name   string
	Prefix netip.Prefix
	// Key tells apart the bridges of different state dirs (alias, MAC).
	Key string
	// Record is where the bridge's interface index is kept (bridge.json).
	Record string
	// NAT lets VMs out masqueraded; AllowVMToVM lets them reach each other.
	NAT, AllowVMToVM bool
	Locks            *lock.Locker
}

// Container networking: one host bridge per driver config, one veth per
// VM (host end on the bridge, the other as eth0 in the VM's network
// namespace, which the runtime made). The host is the bridge's first
// address; nothing is routed or translated beyond it.

// ip runs iproute2's ip with args.
func ip(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Env = []string{"PATH=" + toolPath}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Gateway is the bridge's (the host's) address on the VM network.
func (b *Bridge) Gateway() netip.Addr { return b.Prefix.Addr().Next() }

// bridgeAlias marks the bridge this driver (this state dir) made: only
// such a bridge is ever configured, never an interface someone else has.
func (b *Bridge) bridgeAlias() string { return "runway-cpi " + b.Key }

// linkAlias is an interface's alias in bin/cpi's network namespace (ip
// asks the kernel over netlink; /sys may show another namespace's).
func linkAlias(ctx context.Context, name string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", "-o", "link", "show", "dev", name)
	cmd.Env = []string{"PATH=" + toolPath}
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("ip link show %s: %w", name, err)
	}
	if _, alias, ok := strings.Cut(strings.TrimSpace(string(out)), `\    alias `); ok {
		return alias, nil
	}
	return "", nil
}

// bridgeRecord is the bridge the driver made, by interface index: the fast
// path of every create_vm trusts an interface only while its index is the
// one the driver made (a bridge deleted and made again by someone else
// gets another).
type bridgeRecord struct {
	Name  string `json:"name"`
	Index int    `json:"index"`
}

// bridgeMAC is the bridge's hardware address, fixed (locally
// administered, from the state dir). Left to the kernel, a bridge takes
// the lowest of its ports' addresses, so every VM made or deleted may
// change the gateway's MAC under the other VMs' ARP caches: their packets
// go astray until the entry expires, and TCP's backoff stretches that
// into stalls of a minute or two.
func (b *Bridge) bridgeMAC() net.HardwareAddr {
	sum := sha256.Sum256([]byte(b.bridgeAlias()))
	return append(net.HardwareAddr{0x02}, sum[:5]...)
}

func hasMAC(br string, mac net.HardwareAddr) bool {
	i, err := lookupIf(br)
	return err == nil && bytes.Equal(i.mac, mac)
}

// ownBridge answers interface br when it is the bridge the driver made.
func (b *Bridge) ownBridge(br string) (ifinfo, bool) {
	var rec bridgeRecord
	i, err := lookupIf(br)
	if err != nil || record.Read(b.Record, &rec) != nil || rec.Name != br || rec.Index != i.index {
		return ifinfo{}, false
	}
	return i, true
}

// Ensure makes the bridge, with the host's address, when missing.
// It does not forward what arrives from VMs: they reach the host only.
// An interface of that name that the driver did not make is refused, and
// a bridge it made here is removed again when setting it up fails.
func (b *Bridge) Ensure(ctx context.Context) error {
	br := b.Name
	want := netip.PrefixFrom(b.Gateway(), b.Prefix.Bits()).String()
	mac := b.bridgeMAC()
	if i, ok := b.ownBridge(br); ok && bytes.Equal(i.mac, mac) && i.up && i.addr.String() == want {
		return nil
	}
	unlock, err := b.Locks.Lock(ctx, "state-bridge")
	if err != nil {
		return err
	}
	defer unlock()
	made := false
	if _, err := lookupIf(br); err == nil {
		a, err := linkAlias(ctx, br)
		if err != nil {
			return err
		}
		if a != b.bridgeAlias() {
			return fmt.Errorf("container.bridge: interface %s exists and is not the bridge of this state dir (alias %q, want %q): name another bridge, or delete it if an earlier Runway made it (ip link del %s)", br, a, b.bridgeAlias(), br)
		}
	} else {
		if err := ip(ctx, "link", "add", br, "type", "bridge"); err != nil {
			return fmt.Errorf("making bridge %s: %w", br, err)
		}
		made = true
		if err := ip(ctx, "link", "set", br, "alias", b.bridgeAlias()); err != nil {
			_ = DeleteLink(br)
			return fmt.Errorf("marking bridge %s: %w", br, err)
		}
	}
	err = func() error {
		if !hasMAC(br, mac) {
			if err := ip(ctx, "link", "set", br, "address", mac.String()); err != nil {
				return fmt.Errorf("fixing the address of bridge %s: %w", br, err)
			}
		}
		if !hasAddr(br, want) {
			if err := ip(ctx, "addr", "add", want, "dev", br); err != nil {
				return fmt.Errorf("addressing bridge %s: %w", br, err)
			}
		}
		if err := b.firewall(ctx); err != nil {
			return fmt.Errorf("bridge %s: %w", br, err)
		}
		if err := ensureGuard(ctx, GuardTable(b.Key)); err != nil {
			return fmt.Errorf("bridge %s: the ports' guard: %w", br, err)
		}
		if err := ip(ctx, "link", "set", br, "up"); err != nil {
			return err
		}
		i, err := lookupIf(br)
		if err != nil {
			return err
		}
		return record.Write(b.Record, bridgeRecord{Name: br, Index: i.index})
	}()
	if err != nil && made {
		_ = DeleteLink(br)
	}
	return err
}

// firewall sets what may cross the bridge, once, when the driver makes it.
// Never: a connection from beyond the host into a VM. Without NAT, VMs
// reach the host only (the bridge does not forward); with it, their
// connections out are masqueraded as the host's.
func (b *Bridge) firewall(ctx context.Context) error {
	br, cidr := b.Name, b.Prefix.String()
	fwd := "0\n"
	if b.NAT {
		// Forwarding on for the namespace (every interface), as Docker does.
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
			return fmt.Errorf("turning IPv4 forwarding on: %w", err)
		}
		fwd = "1\n"
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/conf/"+br+"/forwarding", []byte(fwd), 0o644); err != nil {
		return fmt.Errorf("setting forwarding: %w", err)
	}
	// Each rule goes to the top of its chain, so later ones come first:
	// the accepting ones before the catch-all drop.
	out := "DROP"
	if b.NAT {
		out = "ACCEPT"
	}
	rules := [][]string{
		{"filter", "FORWARD", "!", "-i", br, "-o", br, "-j", "DROP"},
		{"filter", "FORWARD", "-i", br, "!", "-o", br, "-j", out},
	}
	if b.NAT {
		rules = append(rules,
			[]string{"filter", "FORWARD", "!", "-i", br, "-o", br, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"},
			[]string{"nat", "POSTROUTING", "-s", cidr, "!", "-o", br, "-j", "MASQUERADE"})
	}
	for _, r := range rules {
		if err := ensureRule(ctx, r[0], r[1], r[2:]...); err != nil {
			return err
		}
	}
	return nil
}

// ensureRule inserts an iptables rule unless it is there.
func ensureRule(ctx context.Context, table, chain string, spec ...string) error {
	run := func(op string) error {
		cmd := exec.CommandContext(ctx, "iptables", append([]string{"-w", "-t", table, op, chain}, spec...)...)
		cmd.Env = []string{"PATH=" + toolPath}
		out, err := cmd.CombinedOutput()
		if err != nil {
			return fmt.Errorf("iptables -t %s %s %s %s: %w: %s", table, op, chain, strings.Join(spec, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if run("-C") == nil {
		return nil
	}
	return run("-I")
}

// hasAddr: interface ifname is up with prefix as its IPv4 address.
func hasAddr(ifname, prefix string) bool {
	i, err := lookupIf(ifname)
	return err == nil && i.up && i.addr.String() == prefix
}
