package local

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
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

// ensureBridge makes the bridge, with the host's address, when missing.
// It does not forward what arrives from VMs: they reach the host only.
func (d *Driver) ensureBridge(ctx context.Context) error {
	br := d.cfg.Container.Bridge
	want := netip.PrefixFrom(d.gateway(), d.prefix.Bits()).String()
	if hasAddr(br, want) {
		return nil
	}
	unlock, err := d.locks.Lock(ctx, "state-bridge")
	if err != nil {
		return err
	}
	defer unlock()
	if _, err := net.InterfaceByName(br); err != nil {
		if err := ip(ctx, "link", "add", br, "type", "bridge"); err != nil {
			return fmt.Errorf("making bridge %s: %w", br, err)
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
	return ip(ctx, "link", "set", br, "up")
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
	if _, err := exec.LookPath("iptables"); err != nil {
		if d.cfg.Container.NAT {
			return errors.New("container.nat needs iptables (Debian's iptables package)")
		}
		return nil // no forwarding from the bridge; inbound: the host's own rules
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
}

func (d *Driver) netPlan(c ctr, nets driver.Networks) netPlan {
	p := netPlan{Bridge: d.cfg.Container.Bridge, HostIf: c.hostIf(), Gateway: d.gateway().String()}
	names := make([]string, 0, len(nets))
	for name := range nets {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if a, err := netip.ParseAddr(nets[name].IP); err == nil {
			p.Addrs = append(p.Addrs, netip.PrefixFrom(a, d.prefix.Bits()).String())
		}
	}
	return p
}

// connect plugs the container whose init is pid into the bridge.
func (p netPlan) connect(ctx context.Context, pid int) error {
	_ = deleteLink(p.HostIf) // left by an earlier run of this VM
	if err := ip(ctx, "link", "add", p.HostIf, "type", "veth", "peer", "name", "eth0", "netns", strconv.Itoa(pid)); err != nil {
		return err
	}
	if err := ip(ctx, "link", "set", p.HostIf, "master", p.Bridge, "up"); err != nil {
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
