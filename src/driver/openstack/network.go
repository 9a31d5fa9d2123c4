package openstack

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/attributestags"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/runway-cpi/runway/src/clip"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/netprefix"
)

type plannedNet struct {
	name  string
	net   driver.Network
	props netProps
	port  string
}

// planNetworks orders the BOSH networks (the default-gateway one first,
// then by name) and checks each: dynamic and manual need net_id, manual
// needs its ip. A vip network (at most one) is a floating IP, answered
// apart: it is associated once the server is up.
func planNetworks(in driver.Networks) (nets []plannedNet, vip *plannedNet, err error) {
	for name, n := range in {
		if err := netprefix.CheckNoDelegation(n, name, "openstack"); err != nil {
			return nil, nil, &driver.CreationError{Err: err}
		}
		switch n.Type {
		case "", "manual":
			n.Type = "manual"
		case "dynamic", "vip":
		default:
			return nil, nil, &driver.CreationError{Err: driver.Invalid("%s: unknown network type (manual, dynamic or vip)", describeNet(name, n))}
		}
		var np netProps
		if err := n.CloudProperties.Decode("networks."+name+".cloud_properties", &np); err != nil {
			return nil, nil, &driver.CreationError{Err: err}
		}
		if n.Type == "vip" {
			switch {
			case vip != nil:
				return nil, nil, &driver.CreationError{Err: driver.Invalid("%s: only one vip network per VM (%s is one)", describeNet(name, n), vip.name)}
			case n.IP == "":
				return nil, nil, &driver.CreationError{Err: driver.Invalid("%s has no ip (the floating IP to associate)", describeNet(name, n))}
			case np.NetID != "" || np.VRRPPortCheck != nil:
				return nil, nil, &driver.CreationError{Err: driver.Invalid("%s: net_id and vrrp_port_check have no meaning on a vip network (the floating IP is found by its address)", describeNet(name, n))}
			}
			vip = &plannedNet{name: name, net: n, props: np}
			continue
		}
		if np.NetID == "" {
			return nil, nil, &driver.CreationError{Err: driver.Invalid("%s needs cloud_properties.net_id (the Neutron network id)", describeNet(name, n))}
		}
		if n.Type == "manual" && n.IP == "" {
			return nil, nil, &driver.CreationError{Err: driver.Invalid("%s has no ip", describeNet(name, n))}
		}
		nets = append(nets, plannedNet{name: name, net: n, props: np})
	}
	sort.Slice(nets, func(i, j int) bool {
		gi, gj := len(nets[i].net.Default) > 0, len(nets[j].net.Default) > 0
		if gi != gj {
			return gi
		}
		return nets[i].name < nets[j].name
	})
	if vip != nil && gatewayNet(nets) == nil {
		return nil, nil, &driver.CreationError{Err: driver.Invalid("%s: a floating IP needs the VM's gateway network: one manual or dynamic network, or the one whose default has gateway", describeNet(vip.name, vip.net))}
	}
	return nets, vip, nil
}

// gatewayNet is the network a floating IP, a VRRP address and a load
// balancer member go to, as the official CPI picks it: the only private
// network, else the one whose default includes gateway.
func gatewayNet(nets []plannedNet) *plannedNet {
	if len(nets) == 1 {
		return &nets[0]
	}
	for i := range nets {
		if slices.Contains(nets[i].net.Default, "gateway") {
			return &nets[i]
		}
	}
	return nil
}

func allPorts(nets []plannedNet) bool {
	for _, n := range nets {
		if n.port == "" {
			return false
		}
	}
	return true
}

// createPorts makes a port for each manual network (dynamic ones are
// Nova's) and answers the server's NICs in order.
func (d *Driver) createPorts(ctx context.Context, c *creation, pl *vmPlan) ([]servers.Network, error) {
	var nics []servers.Network
	for i := range pl.nets {
		n := &pl.nets[i]
		if n.net.Type != "manual" {
			nics = append(nics, servers.Network{UUID: n.props.NetID})
			continue
		}
		pair := ""
		if n == pl.gateway {
			pair = pl.pair
		}
		port, err := d.createPort(ctx, c, n, pl.creator, pl.groups, pair)
		if err != nil {
			return nil, err
		}
		n.port = port
		nics = append(nics, servers.Network{Port: port})
		pl.md[mdPorts] = "1"
	}
	return nics, nil
}

// createPort makes a port with the manual network's fixed IP, tagged so a
// reaper (or the next delete_vm of the agent) finds it if we die.
// pair, when set, is an address the port may also answer for (VRRP).
func (d *Driver) createPort(ctx context.Context, c *creation, n *plannedNet, creator map[string]string, groups []string, pair string) (string, error) {
	opts := ports.CreateOpts{NetworkID: n.props.NetID, Name: c.name,
		Description: portDescription(creator[mdDirector], creator[mdAgent]),
		FixedIPs:    []ports.IP{{IPAddress: n.net.IP}}}
	if pair != "" {
		opts.AllowedAddressPairs = []ports.AddressPair{{IPAddress: pair}}
	}
	if len(groups) > 0 {
		ids, err := d.securityGroupIDs(ctx, groups)
		if err != nil {
			return "", err
		}
		opts.SecurityGroups = &ids
	}
	var port *ports.Port
	reclaimed, posts, heldBy := false, 0, ""
	_, err := d.do(ctx, "network", "create port", func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		if posts > 0 {
			// The earlier POST's outcome is unknown: adopt what it made.
			if p, err := portNamed(ctx, sc, n.props.NetID, c.name); err != nil || p != nil {
				if p != nil {
					d.Log.Info("an earlier attempt made it; adopting it", "op", "create port", "port", p.ID)
				}
				port = p
				return err
			}
		}
		posts++
		var err error
		port, err = ports.Create(ctx, sc, opts).Extract()
		if err == nil || status(err) != 409 || !strings.Contains(apiMessage(err), "already allocated") {
			return err
		}
		holder := d.findPort(ctx, sc, n.props.NetID, n.net.IP)
		switch {
		case holder == nil:
			return err
		case holder.Name == c.name:
			// A resent POST that took effect the first time holds our IP.
			port = holder
			return nil
		case !reclaimed && d.orphanPort(ctx, holder, creator):
			// A create_vm killed between its port and its server left
			// this port holding the address: remove it and try again.
			reclaimed = true
			d.Log.Info("deleting a port held for a server that was never created", "port", holder.ID, "ip", n.net.IP, "server_name", holder.Name)
			if derr := ports.Delete(ctx, sc, holder.ID).ExtractErr(); derr != nil && !isNotFound(derr) {
				return derr
			}
			posts++
			port, err = ports.Create(ctx, sc, opts).Extract()
			return err
		}
		// Held by a port that may belong to a create_vm in flight (or to
		// a VM): a conflict another try can get past once it is settled.
		heldBy = fmt.Sprintf("fixed IP %s is held by port %s (%s, made %s ago), which may belong to a create_vm still in flight or to another VM",
			n.net.IP, holder.ID, holder.Name, time.Since(holder.CreatedAt).Round(time.Second))
		return err
	})
	if err != nil {
		err = d.cloudErr("create port on "+n.props.NetID+" for "+n.net.IP, err)
		if heldBy != "" {
			err = fmt.Errorf("%s: %w", heldBy, err)
		}
		return "", err
	}
	c.ports = append(c.ports, port.ID)
	tags := serverTags(creator)
	tags = append(tags, clip.To(mdVM+tagSep+c.name, 60))
	if _, err := d.do(ctx, "network", "tag port "+port.ID, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		_, err := attributestags.ReplaceAll(ctx, sc, "ports", port.ID, attributestags.ReplaceAllOpts{Tags: tags}).Extract()
		return err
	}); err != nil {
		return "", d.cloudErr("tag port "+port.ID, err)
	}
	return port.ID, nil
}

// portDescription marks a port as runway's, atomically with its creation
// (Neutron takes tags only in a second request, which a killed process
// may never send): delete_vm and reapers find ports by it.
func portDescription(director, agent string) string {
	return "runway director=" + clip.To(director, 100) + " agent_id=" + clip.To(agent, 100)
}

// findPort returns the port holding ip on network, if any.
func (d *Driver) findPort(ctx context.Context, sc *gophercloud.ServiceClient, network, ip string) *ports.Port {
	list, err := all(ctx, ports.List(sc, ports.ListOpts{NetworkID: network, FixedIPs: []ports.FixedIPOpts{{IPAddress: ip}}}), ports.ExtractPorts)
	if err != nil || len(list) == 0 {
		return nil
	}
	return &list[0]
}

// portNamed returns the port called name on network, if any.
func portNamed(ctx context.Context, sc *gophercloud.ServiceClient, network, name string) (*ports.Port, error) {
	list, err := all(ctx, ports.List(sc, ports.ListOpts{NetworkID: network, Name: name}), ports.ExtractPorts)
	if err != nil || len(list) == 0 {
		return nil, err
	}
	return &list[0], nil
}

// createLock is held by a create_vm for as long as its ports may be
// unbound.
func createLock(name string) string { return "openstack-create-" + name }

// orphanAge: no create_vm leaves its port unbound this long (its requests
// and waits are each bounded far below it).
const orphanAge = time.Hour

// createOver proves that the create_vm that made port p is not in flight:
// on this host its lock file exists and the lock is free (the process
// died); from elsewhere, the port is older than any create_vm lasts. A
// finished create on this host removed its lock file, so its leftovers
// wait for the age too.
func (d *Driver) createOver(p *ports.Port) bool {
	name := createLock(p.Name)
	if _, err := os.Stat(filepath.Join(d.Locks.Dir, name+".lock")); err == nil {
		release, free, err := d.Locks.TryLock(name)
		if err != nil || !free {
			return false
		}
		d.Locks.Release(name, release, true)
		return true
	}
	return !p.CreatedAt.IsZero() && time.Since(p.CreatedAt) > orphanAge
}

// orphanPort: runway made the port for the same director, it is bound to
// nothing, the create_vm that made it is provably over, and no server
// carries the name it was made for.
func (d *Driver) orphanPort(ctx context.Context, p *ports.Port, creator map[string]string) bool {
	dir := creator[mdDirector]
	if p.DeviceID != "" || dir == "" || !strings.HasPrefix(p.Description, "runway director="+clip.To(dir, 100)+" ") {
		return false
	}
	if !d.createOver(p) {
		return false
	}
	found := true
	_, err := d.do(ctx, "compute", "find server "+p.Name, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		list, err := serversNamed(ctx, sc, p.Name)
		found = len(list) > 0
		return err
	})
	return err == nil && !found
}

// deletePorts removes the ports runway made for this server (by the name
// they share) and the unbound ports of its director and agent (left by a
// create_vm killed between port and server). Director and agent come
// from the server's tags: set_vm_metadata may overwrite the metadata
// (the Director's "director" is its name, not its uuid). Ports bound to
// another server are left alone.
func (d *Driver) deletePorts(ctx context.Context, s *servers.Server) {
	tags := map[string]string{}
	if s.Tags != nil {
		for _, t := range *s.Tags {
			if k, v, ok := strings.Cut(t, tagSep); ok {
				tags[k] = v
			}
		}
	}
	queries := []ports.ListOpts{{Description: portDescription(tags[mdDirector], tags[mdAgent])}}
	if name := s.Metadata[mdVM]; name != "" {
		queries = append(queries, ports.ListOpts{Name: name})
	}
	var list []ports.Port
	seen := map[string]bool{}
	for _, q := range queries {
		_, err := d.do(ctx, "network", "list runway's ports of server "+s.ID, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
			found, err := all(ctx, ports.List(sc, q), ports.ExtractPorts)
			for _, p := range found {
				if !seen[p.ID] && strings.HasPrefix(p.Description, "runway ") {
					seen[p.ID] = true
					list = append(list, p)
				}
			}
			return err
		})
		if err != nil {
			d.Log.Warn("listing the server's ports failed", "server", s.ID, "err", err)
			return
		}
	}
	for _, p := range list {
		if p.DeviceID != "" && p.DeviceID != s.ID {
			continue
		}
		// An unbound port of the agent made for another server name may
		// be a create_vm's in flight (the same agent, a retry).
		if p.DeviceID == "" && p.Name != s.Metadata[mdVM] && !d.createOver(&p) {
			continue
		}
		if _, err := d.do(ctx, "network", "delete port "+p.ID, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
			err := ports.Delete(ctx, sc, p.ID).ExtractErr()
			if isNotFound(err) {
				return nil
			}
			return err
		}); err != nil {
			d.Log.Warn("deleting a port failed", "port", p.ID, "server", s.ID, "err", err)
		}
	}
}

// assignedNetworks answers the networks hash with the addresses the
// server got: manual networks keep their ip; a dynamic network takes the
// server's address on it (by port when the server has several networks).
func (d *Driver) assignedNetworks(ctx context.Context, srv *servers.Server, in driver.Networks, nets []plannedNet) (driver.Networks, error) {
	out := make(driver.Networks, len(in))
	for name, n := range in {
		out[name] = n
	}
	var byNet map[string]string
	for _, pn := range nets {
		if pn.net.Type != "dynamic" {
			continue
		}
		ip := ""
		if len(nets) == 1 {
			ip = onlyAddress(srv)
		}
		if ip == "" {
			if byNet == nil {
				var err error
				if byNet, err = d.portAddresses(ctx, srv.ID); err != nil {
					return nil, err
				}
			}
			ip = byNet[pn.props.NetID]
		}
		if ip == "" {
			return nil, fmt.Errorf("server %s has no address on network %s (%s)", srv.ID, pn.name, pn.props.NetID)
		}
		n := out[pn.name]
		n.IP = ip
		out[pn.name] = n
	}
	return out, nil
}

// onlyAddress is the fixed address of a server on exactly one network.
func onlyAddress(srv *servers.Server) string {
	if len(srv.Addresses) != 1 {
		return ""
	}
	for name := range srv.Addresses {
		return fixedAddress(srv, name)
	}
	return ""
}

// fixedAddress is the server's first fixed address on the network of
// that name (Nova keys addresses by network name).
func fixedAddress(srv *servers.Server, network string) string {
	list, _ := srv.Addresses[network].([]any)
	for _, a := range list {
		m, _ := a.(map[string]any)
		if t, _ := m["OS-EXT-IPS:type"].(string); t == "floating" {
			continue
		}
		if ip, _ := m["addr"].(string); ip != "" {
			return ip
		}
	}
	return ""
}

// networkNames maps Neutron network ids to names.
func (d *Driver) networkNames(ctx context.Context) (map[string]string, error) {
	list, err := read(ctx, d, "network", "list networks", nil, func(ctx context.Context, sc *gophercloud.ServiceClient) ([]networks.Network, error) {
		return all(ctx, networks.List(sc, networks.ListOpts{}), networks.ExtractNetworks)
	})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, n := range list {
		out[n.ID] = n.Name
	}
	return out, nil
}

// portAddresses maps network id → first fixed IP of the server's ports.
func (d *Driver) portAddresses(ctx context.Context, serverID string) (map[string]string, error) {
	list, err := read(ctx, d, "network", "list ports of "+serverID, nil, func(ctx context.Context, sc *gophercloud.ServiceClient) ([]ports.Port, error) {
		return all(ctx, ports.List(sc, ports.ListOpts{DeviceID: serverID}), ports.ExtractPorts)
	})
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, p := range list {
		if len(p.FixedIPs) > 0 && out[p.NetworkID] == "" {
			out[p.NetworkID] = p.FixedIPs[0].IPAddress
		}
	}
	return out, nil
}

// securityGroupIDs resolves names (ids pass through) for Neutron ports.
func (d *Driver) securityGroupIDs(ctx context.Context, names []string) ([]string, error) {
	var out []string
	for _, g := range names {
		if uuid.Validate(g) == nil && len(g) == 36 {
			out = append(out, g)
			continue
		}
		found, err := read(ctx, d, "network", "find security group "+g, nil, func(ctx context.Context, sc *gophercloud.ServiceClient) ([]groups.SecGroup, error) {
			return all(ctx, groups.List(sc, groups.ListOpts{Name: g}), groups.ExtractGroups)
		})
		if err != nil {
			return nil, err
		}
		if len(found) != 1 {
			return nil, driver.Invalid("security group %q: %d groups have that name", g, len(found))
		}
		out = append(out, found[0].ID)
	}
	return out, nil
}
