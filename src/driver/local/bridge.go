package local

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/runway-cpi/runway/src/driver"
)

// Container networking: one host bridge per driver config, one veth per
// VM (host end on the bridge, the other as eth0 in the VM's network
// namespace, which the runtime made). The host is the bridge's first
// address; nothing is routed or translated beyond it.

// ip runs iproute2's ip with args.
func ip(ctx context.Context, args ...string) error {
	cmd := exec.CommandContext(ctx, "ip", args...)
	cmd.Env = []string{"PATH=" + vmPath}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// gateway is the bridge's (the host's) address on the VM network.
func (d *Driver) gateway() netip.Addr { return d.prefix.Addr().Next() }

// bridgeAlias marks the bridge this driver (this state dir) made: only
// such a bridge is ever configured, never an interface someone else has.
func (d *Driver) bridgeAlias() string { return "runway-cpi " + d.stateKey() }

// linkAlias is an interface's alias in bin/cpi's network namespace (ip
// asks the kernel over netlink; /sys may show another namespace's).
func linkAlias(ctx context.Context, name string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", "-o", "link", "show", "dev", name)
	cmd.Env = []string{"PATH=" + vmPath}
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
func (d *Driver) bridgeRecord() string { return filepath.Join(d.root, "bridge.json") }

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
func (d *Driver) bridgeMAC() net.HardwareAddr {
	sum := sha256.Sum256([]byte(d.bridgeAlias()))
	return append(net.HardwareAddr{0x02}, sum[:5]...)
}

func hasMAC(br string, mac net.HardwareAddr) bool {
	i, err := net.InterfaceByName(br)
	return err == nil && bytes.Equal(i.HardwareAddr, mac)
}

// ownBridge is interface br when it is the bridge the driver made, else nil.
func (d *Driver) ownBridge(br string) *net.Interface {
	var rec bridgeRecord
	i, err := net.InterfaceByName(br)
	if err != nil || readJSON(d.bridgeRecord(), &rec) != nil || rec.Name != br || rec.Index != i.Index {
		return nil
	}
	return i
}

// ensureBridge makes the bridge, with the host's address, when missing.
// It does not forward what arrives from VMs: they reach the host only.
// An interface of that name that the driver did not make is refused, and
// a bridge it made here is removed again when setting it up fails.
func (d *Driver) ensureBridge(ctx context.Context) error {
	br := d.cfg.Container.Bridge
	want := netip.PrefixFrom(d.gateway(), d.prefix.Bits()).String()
	mac := d.bridgeMAC()
	if i := d.ownBridge(br); i != nil && bytes.Equal(i.HardwareAddr, mac) && hasAddr(br, want) {
		return nil
	}
	unlock, err := d.locks.Lock(ctx, "state-bridge")
	if err != nil {
		return err
	}
	defer unlock()
	made := false
	if _, err := net.InterfaceByName(br); err == nil {
		a, err := linkAlias(ctx, br)
		if err != nil {
			return err
		}
		if a != d.bridgeAlias() {
			return fmt.Errorf("container.bridge: interface %s exists and is not the bridge of this state dir (alias %q, want %q): name another bridge, or delete it if an earlier Runway made it (ip link del %s)", br, a, d.bridgeAlias(), br)
		}
	} else {
		if err := ip(ctx, "link", "add", br, "type", "bridge"); err != nil {
			return fmt.Errorf("making bridge %s: %w", br, err)
		}
		made = true
		if err := ip(ctx, "link", "set", br, "alias", d.bridgeAlias()); err != nil {
			_ = deleteLink(br)
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
		if err := d.firewall(ctx); err != nil {
			return fmt.Errorf("bridge %s: %w", br, err)
		}
		if err := ip(ctx, "link", "set", br, "up"); err != nil {
			return err
		}
		i, err := net.InterfaceByName(br)
		if err != nil {
			return err
		}
		return writeJSON(d.bridgeRecord(), bridgeRecord{Name: br, Index: i.Index})
	}()
	if err != nil && made {
		_ = deleteLink(br)
	}
	return err
}

// firewall sets what may cross the bridge, once, when the driver makes it.
// Never: a connection from beyond the host into a VM. Without NAT, VMs
// reach the host only (the bridge does not forward); with it, their
// connections out are masqueraded as the host's.
func (d *Driver) firewall(ctx context.Context) error {
	br, cidr := d.cfg.Container.Bridge, d.prefix.String()
	fwd := "0\n"
	if d.cfg.Container.NAT {
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
	if d.cfg.Container.NAT {
		out = "ACCEPT"
	}
	rules := [][]string{
		{"filter", "FORWARD", "!", "-i", br, "-o", br, "-j", "DROP"},
		{"filter", "FORWARD", "-i", br, "!", "-o", br, "-j", out},
	}
	if d.cfg.Container.NAT {
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
		cmd.Env = []string{"PATH=" + vmPath}
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

func hasAddr(ifname, prefix string) bool {
	i, err := net.InterfaceByName(ifname)
	if err != nil || i.Flags&net.FlagUp == 0 {
		return false
	}
	addrs, _ := i.Addrs()
	for _, a := range addrs {
		if a.String() == prefix {
			return true
		}
	}
	return false
}

// netPlan is what the supervisor configures between the runtime's create
// and start: written by create_vm, read by the supervisor.
type netPlan struct {
	Bridge  string   `json:"bridge"`
	HostIf  string   `json:"host_if"`
	Addrs   []string `json:"addrs"` // CIDR notation, on eth0
	Gateway string   `json:"gateway"`
	// Isolated: the VM's bridge port talks to the host only, not to the
	// other VMs' ports (the kernel's bridge port isolation).
	Isolated bool `json:"isolated"`
}

func (d *Driver) netPlan(c ctr, nets driver.Networks) netPlan {
	p := netPlan{Bridge: d.cfg.Container.Bridge, HostIf: c.hostIf(), Gateway: d.gateway().String(), Isolated: !d.cfg.Container.AllowVMToVM}
	names := make([]string, 0, len(nets))
	for name := range nets {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		a, err := netip.ParseAddr(nets[name].IP)
		if err != nil {
			continue
		}
		bits := d.prefix.Bits()
		if m := net.ParseIP(nets[name].Netmask).To4(); m != nil {
			bits, _ = net.IPMask(m).Size()
		}
		p.Addrs = append(p.Addrs, netip.PrefixFrom(a, bits).String())
	}
	return p
}

// connect plugs the container whose init is pid into the bridge.
func (p netPlan) connect(ctx context.Context, pid int) error {
	_ = deleteLink(p.HostIf) // left by an earlier run of this VM
	if err := ip(ctx, "link", "add", p.HostIf, "type", "veth", "peer", "name", "eth0", "netns", strconv.Itoa(pid)); err != nil {
		return err
	}
	if err := ip(ctx, "link", "set", p.HostIf, "master", p.Bridge); err != nil {
		return err
	}
	if p.Isolated {
		if err := ip(ctx, "link", "set", "dev", p.HostIf, "type", "bridge_slave", "isolated", "on"); err != nil {
			return err
		}
	}
	if err := ip(ctx, "link", "set", p.HostIf, "up"); err != nil {
		return err
	}
	// One nsenter for the inside: ip in batch mode.
	var batch strings.Builder
	batch.WriteString("link set lo up\n")
	for _, a := range p.Addrs {
		batch.WriteString("addr add " + a + " dev eth0\n")
	}
	batch.WriteString("link set eth0 up\n")
	if len(p.Addrs) > 0 {
		batch.WriteString("route add default via " + p.Gateway + "\n")
	}
	cmd := exec.CommandContext(ctx, "nsenter", "-t", strconv.Itoa(pid), "-n", "ip", "-b", "-")
	cmd.Env = []string{"PATH=" + vmPath}
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("configuring the vm's network: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// deleteLink removes a host interface if it is there.
func deleteLink(name string) error {
	if _, err := net.InterfaceByName(name); err != nil {
		return nil
	}
	if err := ip(context.Background(), "link", "del", name); err != nil {
		if _, gone := net.InterfaceByName(name); gone != nil {
			return nil // went with its namespace meanwhile
		}
		return err
	}
	return nil
}
