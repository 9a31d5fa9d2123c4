package hostnet

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"sort"
	"strconv"
	"strings"

	"github.com/runway-cpi/runway/src/driver"
)

// Plan is what the supervisor configures between the runtime's create
// and start: written by create_vm, read by the supervisor.
type Plan struct {
	Bridge string `json:"bridge"`
	HostIf string `json:"host_if"`
	// MAC is eth0's hardware address; Table the port guard's table.
	MAC     string   `json:"mac"`
	Table   string   `json:"table"`
	Addrs   []string `json:"addrs"` // CIDR notation, on eth0
	Gateway string   `json:"gateway"`
	// Isolated: the VM's bridge port talks to the host only, not to the
	// other VMs' ports (the kernel's bridge port isolation).
	Isolated bool `json:"isolated"`
}

// Plan is how VM cid, whose host end is hostIf, joins the bridge with nets.
func (b *Bridge) Plan(cid, hostIf string, nets driver.Networks) Plan {
	p := Plan{Bridge: b.Name, HostIf: hostIf, Gateway: b.Gateway().String(), Isolated: !b.AllowVMToVM,
		MAC: VMMAC(b.Key, cid).String(), Table: GuardTable(b.Key)}
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
		bits := b.Prefix.Bits()
		if m := net.ParseIP(nets[name].Netmask).To4(); m != nil {
			bits, _ = net.IPMask(m).Size()
		}
		p.Addrs = append(p.Addrs, netip.PrefixFrom(a, bits).String())
	}
	return p
}

// Connect plugs the container whose init is pid into the bridge.
func (p Plan) Connect(ctx context.Context, pid int) error {
	_ = DeleteLink(p.HostIf) // left by an earlier run of this VM
	mac, err := net.ParseMAC(p.MAC)
	if err != nil {
		return fmt.Errorf("the vm's hardware address: %w", err)
	}
	if err := ip(ctx, "link", "add", p.HostIf, "type", "veth", "peer", "name", "eth0", "address", mac.String(), "netns", strconv.Itoa(pid)); err != nil {
		return err
	}
	// Guarded before it joins the bridge: no frame of it passes unchecked.
	if err := guard(ctx, p.Table, p.HostIf, mac, p.Addrs); err != nil {
		return err
	}
	// The host end onto the bridge, then the inside: ip in batch mode,
	// one process each.
	host := "link set " + p.HostIf + " master " + p.Bridge + "\n"
	if p.Isolated {
		host += "link set dev " + p.HostIf + " type bridge_slave isolated on\n"
	}
	host += "link set " + p.HostIf + " up\n"
	if err := ipBatch(ctx, nil, host); err != nil {
		return err
	}
	var inside strings.Builder
	inside.WriteString("link set lo up\n")
	for _, a := range p.Addrs {
		inside.WriteString("addr add " + a + " dev eth0\n")
	}
	inside.WriteString("link set eth0 up\n")
	if len(p.Addrs) > 0 {
		inside.WriteString("route add default via " + p.Gateway + "\n")
	}
	if err := ipBatch(ctx, []string{"nsenter", "-t", strconv.Itoa(pid), "-n"}, inside.String()); err != nil {
		return fmt.Errorf("configuring the vm's network: %w", err)
	}
	return nil
}

// ipBatch runs ip's commands in batch mode, behind prefix (nsenter).
func ipBatch(ctx context.Context, prefix []string, commands string) error {
	argv := append(append([]string{}, prefix...), "ip", "-b", "-")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = []string{"PATH=" + toolPath}
	cmd.Stdin = strings.NewReader(commands)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("ip -b: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// DeleteLink removes a host interface if it is there.
func DeleteLink(name string) error {
	if _, err := lookupIf(name); err != nil {
		return nil
	}
	if err := ip(context.Background(), "link", "del", name); err != nil {
		if _, gone := lookupIf(name); gone != nil {
			return nil // went with its namespace meanwhile
		}
		return err
	}
	return nil
}
