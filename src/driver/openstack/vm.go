package openstack

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/attributestags"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/retry"
)

// Server metadata keys the driver owns.
const (
	mdVM    = "runway_vm"    // the name create_vm gave the server (it may be renamed later)
	mdAgent = "agent_id"     // also a creator tag; read back by ListVMs
	mdPorts = "runway_ports" // "1": runway made ports for this server
	// mdDirector is the CPI service's creator tag for the director uuid.
	mdDirector = "director"
)

// CreateVM boots one server and waits until it is ACTIVE. On any failure
// the server(s) and ports this call made are deleted.
func (d *Driver) CreateVM(ctx context.Context, spec driver.VMSpec) (driver.VM, error) {
	var p vmProps
	if err := spec.CloudProps.Decode("cloud_properties", &p); err != nil {
		return driver.VM{}, err
	}
	if err := p.validate(); err != nil {
		return driver.VM{}, err
	}
	image, err := validCID("stemcell", spec.StemcellCID)
	if err != nil {
		return driver.VM{}, &driver.CreationError{Err: fmt.Errorf("%w: %w", driver.ErrStemcellNotFound, err)}
	}
	name := spec.Name
	if name == "" {
		name = "vm-" + uuid.NewString()
	}
	creator := withTags(p.Tags, spec.Tags)
	if spec.AgentID != "" {
		creator[mdAgent] = spec.AgentID
	}
	md := metadata(creator)
	md[mdVM] = name
	md[mdToken] = uuid.NewString()

	nets, err := planNetworks(spec.Networks)
	if err != nil {
		return driver.VM{}, err
	}
	groups := p.SecurityGroups
	for _, n := range nets {
		groups = append(groups, n.props.SecurityGroups...)
	}
	if len(groups) == 0 {
		groups = d.cfg.DefaultSecurityGroups
	}
	userData := p.UserData
	if userData == "" {
		if s, ok := spec.Env["user_data"].(string); ok {
			userData = s
		} else {
			userData = string(spec.AgentSettings)
		}
	}
	if len(userData) > 65535 {
		return driver.VM{}, driver.Invalid("user data is %d bytes; Nova allows 65535", len(userData))
	}
	flavor, err := d.flavorID(ctx, p.InstanceType, false)
	if errors.Is(err, errUnknownFlavor) {
		return driver.VM{}, err // a CloudError: no retry can find it
	}
	if err != nil {
		return driver.VM{}, d.creationError(err)
	}

	// The create's lock is held while its ports may be unbound: a port
	// another process finds unbound is reclaimed only when this lock (on
	// this host) is free, or the port is older than any create lasts.
	unlock, err := d.locks.Lock(ctx, createLock(name))
	if err != nil {
		return driver.VM{}, d.creationError(err)
	}
	defer d.locks.Release(createLock(name), unlock, true)

	// From here on, whatever exists is removed if the call fails.
	c := &creation{d: d, name: name, token: md[mdToken]}
	vm, err := d.createServer(ctx, c, spec, p, md, creator, nets, groups, userData, image, flavor)
	if err != nil {
		c.undo(context.WithoutCancel(ctx))
		return driver.VM{}, err
	}
	return vm, nil
}

func (d *Driver) createServer(ctx context.Context, c *creation, spec driver.VMSpec, p vmProps, md, creator map[string]string,
	nets []plannedNet, groups []string, userData, image, flavor string) (driver.VM, error) {
	var nics []servers.Network
	for i := range nets {
		n := &nets[i]
		if n.net.Type != "manual" {
			nics = append(nics, servers.Network{UUID: n.props.NetID})
			continue
		}
		port, err := d.createPort(ctx, c, n, creator, groups)
		if err != nil {
			return driver.VM{}, d.creationError(err)
		}
		n.port = port
		nics = append(nics, servers.Network{Port: port})
		md[mdPorts] = "1"
	}
	opts := servers.CreateOpts{
		Name: c.name, ImageRef: image, FlavorRef: flavor, AvailabilityZone: p.AvailabilityZone,
		Metadata: md, Tags: serverTags(creator), SecurityGroups: groups,
	}
	if len(nets) == 0 || allPorts(nets) {
		// Nova applies security groups only to ports it makes; ours have them.
		opts.SecurityGroups = nil
	}
	if len(nics) == 0 {
		opts.Networks = "none"
	} else {
		opts.Networks = nics
	}
	if userData != "" {
		opts.UserData = []byte(userData)
	}
	if cd := p.ConfigDrive; cd != nil && *cd || cd == nil && d.cfg.ConfigDrive {
		opts.ConfigDrive = gophercloud.Enabled
	}
	bfv := d.cfg.BootFromVolume
	if p.BootFromVolume != nil {
		bfv = *p.BootFromVolume
	}
	if bfv {
		size := 0
		if p.RootDisk != nil {
			size = mibToGiB(p.RootDisk.SizeMiB)
		}
		if size == 0 {
			return driver.VM{}, &driver.CreationError{Err: driver.Invalid("boot_from_volume needs cloud_properties.root_disk.size")}
		}
		opts.ImageRef = ""
		bd := servers.BlockDevice{SourceType: servers.SourceImage, UUID: image, BootIndex: 0,
			DestinationType: servers.DestinationVolume, VolumeSize: size, DeleteOnTermination: true}
		if p.RootDisk.Type != "" {
			bd.VolumeType = p.RootDisk.Type
		}
		opts.BlockDevice = []servers.BlockDevice{bd}
	}
	keyName := firstNonEmpty(p.KeyName, d.cfg.DefaultKeyName)
	var srv *servers.Server
	create := func() (int, error) {
		var builder servers.CreateOptsBuilder = opts
		if keyName != "" {
			builder = keypairs.CreateOptsExt{CreateOptsBuilder: opts, KeyName: keyName}
		}
		return d.doCreate(ctx, "compute", "create server "+c.name, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
			var err error
			srv, err = servers.Create(ctx, sc, builder, nil).Extract()
			return err
		}, func(ctx context.Context, sc *gophercloud.ServiceClient) (bool, error) {
			list, err := serversNamed(ctx, sc, c.name)
			for i := range list {
				if list[i].Metadata[mdToken] == c.token {
					srv = &list[i]
					return true, nil
				}
			}
			return false, err
		})
	}
	sent, err := create()
	if err != nil && status(err) == 400 && strings.Contains(strings.ToLower(apiMessage(err)), "flavor") {
		// The cached flavor id went stale (flavor recreated): look again once.
		if id, ferr := d.flavorID(ctx, p.InstanceType, true); ferr == nil && id != flavor {
			opts.FlavorRef = id
			var n int
			n, err = create()
			sent += n
		}
	}
	c.sent = sent
	if err != nil {
		return driver.VM{}, d.creationError(d.cloudErr("create server "+c.name, err))
	}
	c.server = srv.ID
	d.log.Info("openstack", "creating server %s (%s) for agent %s", srv.ID, c.name, spec.AgentID)
	if sent > 1 {
		// A resent POST may have booted twice: keep only this one.
		d.sweepServers(ctx, c.name, c.token, srv.ID)
	}
	srv, err = d.waitServer(ctx, srv.ID, "ACTIVE")
	if err != nil {
		return driver.VM{}, d.creationError(err)
	}
	out, err := d.assignedNetworks(ctx, srv, spec.Networks, nets)
	if err != nil {
		return driver.VM{}, d.creationError(err)
	}
	c.done = true
	return driver.VM{CID: srv.ID, Networks: out}, nil
}

func allPorts(nets []plannedNet) bool {
	for _, n := range nets {
		if n.port == "" {
			return false
		}
	}
	return true
}

// creation remembers what a create_vm made, to undo it on failure.
type creation struct {
	d      *Driver
	name   string
	token  string
	sent   int
	server string
	ports  []string
	done   bool
}

func (c *creation) undo(ctx context.Context) {
	if c.done {
		return
	}
	if c.server != "" || c.sent > 0 {
		c.d.sweepServers(ctx, c.name, c.token, "")
	}
	for _, p := range c.ports {
		if _, err := c.d.do(ctx, "network", "delete port "+p, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
			err := ports.Delete(ctx, sc, p).ExtractErr()
			if isNotFound(err) {
				return nil
			}
			return err
		}); err != nil {
			c.d.log.Warn("openstack", "deleting port %s after a failed create: %v", p, err)
		}
	}
}

type plannedNet struct {
	name  string
	net   driver.Network
	props netProps
	port  string
}

// planNetworks orders the BOSH networks (the default-gateway one first,
// then by name) and checks each: dynamic and manual need net_id, manual
// needs its ip. vip (floating IP) networks are not supported yet.
func planNetworks(in driver.Networks) ([]plannedNet, error) {
	var out []plannedNet
	for name, n := range in {
		switch n.Type {
		case "", "manual":
			n.Type = "manual"
		case "dynamic":
		case "vip":
			return nil, &driver.CreationError{Err: fmt.Errorf("%w: %s: floating IPs (vip networks) are not supported by the openstack driver",
				driver.ErrNotSupported, describeNet(name, n))}
		default:
			return nil, &driver.CreationError{Err: driver.Invalid("%s: unknown network type", describeNet(name, n))}
		}
		var np netProps
		if err := n.CloudProperties.Decode("networks."+name+".cloud_properties", &np); err != nil {
			return nil, &driver.CreationError{Err: err}
		}
		if np.NetID == "" {
			return nil, &driver.CreationError{Err: driver.Invalid("%s needs cloud_properties.net_id (the Neutron network id)", describeNet(name, n))}
		}
		if n.Type == "manual" && n.IP == "" {
			return nil, &driver.CreationError{Err: driver.Invalid("%s has no ip", describeNet(name, n))}
		}
		out = append(out, plannedNet{name: name, net: n, props: np})
	}
	sort.Slice(out, func(i, j int) bool {
		gi, gj := len(out[i].net.Default) > 0, len(out[j].net.Default) > 0
		if gi != gj {
			return gi
		}
		return out[i].name < out[j].name
	})
	return out, nil
}

// createPort makes a port with the manual network's fixed IP, tagged so a
// reaper (or the next delete_vm of the agent) finds it if we die.
func (d *Driver) createPort(ctx context.Context, c *creation, n *plannedNet, creator map[string]string, groups []string) (string, error) {
	opts := ports.CreateOpts{NetworkID: n.props.NetID, Name: c.name,
		Description: portDescription(creator[mdDirector], creator[mdAgent]),
		FixedIPs:    []ports.IP{{IPAddress: n.net.IP}}}
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
					d.log.Info("openstack", "create port %s: an earlier attempt made it; adopting it", p.ID)
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
			d.log.Info("openstack", "deleting port %s: it holds %s for %s, a server that was never created", holder.ID, n.net.IP, holder.Name)
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
	tags = append(tags, truncate(mdVM+tagSep+c.name, 60))
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
	return "runway director=" + truncate(director, 100) + " agent_id=" + truncate(agent, 100)
}

// findPort returns the port holding ip on network, if any.
func (d *Driver) findPort(ctx context.Context, sc *gophercloud.ServiceClient, network, ip string) *ports.Port {
	pages, err := ports.List(sc, ports.ListOpts{NetworkID: network, FixedIPs: []ports.FixedIPOpts{{IPAddress: ip}}}).AllPages(ctx)
	if err != nil {
		return nil
	}
	list, err := ports.ExtractPorts(pages)
	if err != nil || len(list) == 0 {
		return nil
	}
	return &list[0]
}

// portNamed returns the port called name on network, if any.
func portNamed(ctx context.Context, sc *gophercloud.ServiceClient, network, name string) (*ports.Port, error) {
	pages, err := ports.List(sc, ports.ListOpts{NetworkID: network, Name: name}).AllPages(ctx)
	if err != nil {
		return nil, err
	}
	list, err := ports.ExtractPorts(pages)
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
	if _, err := os.Stat(filepath.Join(d.locks.Dir, name+".lock")); err == nil {
		release, free, err := d.locks.TryLock(name)
		if err != nil || !free {
			return false
		}
		d.locks.Release(name, release, true)
		return true
	}
	return !p.CreatedAt.IsZero() && time.Since(p.CreatedAt) > orphanAge
}

// orphanPort: runway made the port for the same director, it is bound to
// nothing, the create_vm that made it is provably over, and no server
// carries the name it was made for.
func (d *Driver) orphanPort(ctx context.Context, p *ports.Port, creator map[string]string) bool {
	dir := creator[mdDirector]
	if p.DeviceID != "" || dir == "" || !strings.HasPrefix(p.Description, "runway director="+truncate(dir, 100)+" ") {
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
	for _, v := range srv.Addresses {
		list, _ := v.([]any)
		for _, a := range list {
			m, _ := a.(map[string]any)
			if t, _ := m["OS-EXT-IPS:type"].(string); t == "floating" {
				continue
			}
			if ip, _ := m["addr"].(string); ip != "" {
				return ip
			}
		}
	}
	return ""
}

// portAddresses maps network id → first fixed IP of the server's ports.
func (d *Driver) portAddresses(ctx context.Context, serverID string) (map[string]string, error) {
	out := map[string]string{}
	_, err := d.do(ctx, "network", "list ports of "+serverID, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		pages, err := ports.List(sc, ports.ListOpts{DeviceID: serverID}).AllPages(ctx)
		if err != nil {
			return err
		}
		list, err := ports.ExtractPorts(pages)
		for _, p := range list {
			if len(p.FixedIPs) > 0 && out[p.NetworkID] == "" {
				out[p.NetworkID] = p.FixedIPs[0].IPAddress
			}
		}
		return err
	})
	if err != nil {
		return nil, d.cloudErr("list ports of "+serverID, err)
	}
	return out, nil
}

var errServerFailed = errors.New("server went to ERROR")

// waitServer polls until the server reaches want; ERROR (with Nova's
// fault) or disappearing ends the wait.
func (d *Driver) waitServer(ctx context.Context, id, want string) (*servers.Server, error) {
	var srv *servers.Server
	err := d.waitFor(ctx, "server "+id+" "+want, func(ctx context.Context) (bool, error) {
		s, err := d.server(ctx, id)
		if err != nil {
			return false, err
		}
		srv = s
		switch s.Status {
		case want:
			return true, nil
		case "ERROR":
			msg := s.Fault.Message
			if msg == "" {
				msg = "no fault given"
			}
			return false, fmt.Errorf("%w: %s: %s", errServerFailed, id, msg)
		}
		return false, nil
	})
	return srv, err
}

func (d *Driver) creationError(err error) error {
	var ce *driver.CreationError
	if errors.As(err, &ce) {
		return err
	}
	if errors.Is(err, driver.ErrInvalidInput) || errors.Is(err, driver.ErrStemcellNotFound) || errors.Is(err, driver.ErrNotSupported) {
		return &driver.CreationError{Err: err}
	}
	s := status(err)
	if s == 400 || s == 404 {
		// An unknown flavor, image or network, or a request Nova refuses:
		// a cloud error stating the cloud's reason; a retry cannot help.
		return err
	}
	// Throttles, 5xx, resets, timeouts, a server that failed to build
	// (no valid host, a compute fault) and 409 conflicts can all pass on
	// another try; bad requests, missing flavors/images/networks cannot.
	retryable := classify(err).Class != retry.Permanent || errors.Is(err, retry.ErrBudgetExhausted) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errServerFailed) || s == 409
	return &driver.CreationError{Err: err, Retryable: retryable}
}

// sweepServers deletes every server named name with this call's token,
// except keep, and waits until they are gone.
func (d *Driver) sweepServers(ctx context.Context, name, token, keep string) {
	var list []servers.Server
	_, err := d.do(ctx, "compute", "list servers named "+name, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		var err error
		list, err = serversNamed(ctx, sc, name)
		return err
	})
	if err != nil {
		d.log.Warn("openstack", "listing servers named %s for cleanup: %v", name, err)
		return
	}
	for _, s := range list {
		if s.ID == keep || s.Metadata[mdToken] != token {
			continue
		}
		d.log.Info("openstack", "deleting server %s left by this create", s.ID)
		if err := d.deleteServer(ctx, s.ID); err != nil && !errors.Is(err, driver.ErrVMNotFound) {
			d.log.Warn("openstack", "deleting server %s: %v", s.ID, err)
		}
	}
}

// serversNamed lists the servers named exactly name (Nova matches names
// by regular expression).
func serversNamed(ctx context.Context, sc *gophercloud.ServiceClient, name string) ([]servers.Server, error) {
	pages, err := servers.List(sc, servers.ListOpts{Name: "^" + name + "$"}).AllPages(ctx)
	if err != nil {
		return nil, err
	}
	return servers.ExtractServers(pages)
}

// server reads one server; gone (404, DELETED, SOFT_DELETED) is ErrVMNotFound.
func (d *Driver) server(ctx context.Context, id string) (*servers.Server, error) {
	var s *servers.Server
	_, err := d.do(ctx, "compute", "get server "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		var err error
		s, err = servers.Get(ctx, sc, id).Extract()
		return err
	})
	if isNotFound(err) {
		return nil, fmt.Errorf("server %s: %w", id, driver.ErrVMNotFound)
	}
	if err != nil {
		return nil, d.cloudErr("get server "+id, err)
	}
	if s.Status == "DELETED" || s.Status == "SOFT_DELETED" {
		return s, fmt.Errorf("server %s is %s: %w", id, s.Status, driver.ErrVMNotFound)
	}
	return s, nil
}

// DeleteVM deletes the server, waits until it is gone, then deletes the
// ports runway made for it and any unbound ones its agent left behind.
func (d *Driver) DeleteVM(ctx context.Context, cid string) (err error) {
	id, err := validCID("vm", cid)
	if err != nil {
		return err
	}
	defer func() {
		if err == nil || errors.Is(err, driver.ErrVMNotFound) {
			_ = d.locks.Forget(ctx, vmLock(id)) // its attach lock, if it ever had one
		}
	}()
	s, err := d.server(ctx, id)
	if err != nil {
		return err
	}
	if err := d.deleteServer(ctx, id); err != nil {
		return err
	}
	if s.Metadata[mdPorts] != "" || s.Metadata[mdAgent] != "" {
		d.deletePorts(ctx, s)
	}
	return nil
}

func (d *Driver) deleteServer(ctx context.Context, id string) error {
	err := d.doOnce(ctx, "compute", "delete server "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		return servers.Delete(ctx, sc, id).ExtractErr()
	}, isNotFound)
	if isNotFound(err) {
		return fmt.Errorf("server %s: %w", id, driver.ErrVMNotFound)
	}
	if err != nil {
		return d.cloudErr("delete server "+id, err)
	}
	err = d.waitFor(ctx, "server "+id+" gone", func(ctx context.Context) (bool, error) {
		_, err := d.server(ctx, id)
		if errors.Is(err, driver.ErrVMNotFound) {
			return true, nil
		}
		return false, err
	})
	if err == nil {
		d.log.Info("openstack", "deleted server %s", id)
	}
	return err
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
			pages, err := ports.List(sc, q).AllPages(ctx)
			if err != nil {
				return err
			}
			found, err := ports.ExtractPorts(pages)
			for _, p := range found {
				if !seen[p.ID] && strings.HasPrefix(p.Description, "runway ") {
					seen[p.ID] = true
					list = append(list, p)
				}
			}
			return err
		})
		if err != nil {
			d.log.Warn("openstack", "listing the ports of server %s: %v", s.ID, err)
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
			d.log.Warn("openstack", "deleting port %s of server %s: %v", p.ID, s.ID, err)
		}
	}
}

// HasVM: deleted and soft-deleted servers count as gone.
func (d *Driver) HasVM(ctx context.Context, cid string) (bool, error) {
	id, err := validCID("vm", cid)
	if err != nil {
		return false, err
	}
	_, err = d.server(ctx, id)
	if errors.Is(err, driver.ErrVMNotFound) {
		return false, nil
	}
	return err == nil, err
}

// RebootVM reboots softly, and hard when the soft reboot is refused or
// does not bring the server back within a few minutes.
func (d *Driver) RebootVM(ctx context.Context, cid string) error {
	id, err := validCID("vm", cid)
	if err != nil {
		return err
	}
	if _, err := d.server(ctx, id); err != nil {
		return err
	}
	err = d.reboot(ctx, id, servers.SoftReboot)
	if err == nil {
		sctx, cancel := context.WithTimeout(ctx, softRebootWait(d.cfg))
		_, err = d.waitServer(sctx, id, "ACTIVE")
		cancel()
		if err == nil {
			return nil
		}
	}
	if errors.Is(err, driver.ErrVMNotFound) || ctx.Err() != nil {
		return err
	}
	d.log.Warn("openstack", "soft reboot of %s did not complete (%v); rebooting hard", id, err)
	if err := d.reboot(ctx, id, servers.HardReboot); err != nil {
		return err
	}
	_, err = d.waitServer(ctx, id, "ACTIVE")
	return err
}

// softRebootWait: a guest that ignores ACPI gets this long, then a hard reboot.
func softRebootWait(c Config) time.Duration { return min(c.waitTimeout()/3, 3*time.Minute) }

func (d *Driver) reboot(ctx context.Context, id string, how servers.RebootMethod) error {
	err := d.doOnce(ctx, "compute", fmt.Sprintf("%s reboot %s", how, id), func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		return servers.Reboot(ctx, sc, id, servers.RebootOpts{Type: how}).ExtractErr()
	}, is409)
	if isNotFound(err) {
		return fmt.Errorf("server %s: %w", id, driver.ErrVMNotFound)
	}
	if err != nil {
		return d.cloudErr(fmt.Sprintf("%s reboot %s", how, id), err)
	}
	return nil
}

// StopVM powers the server off and waits for SHUTOFF.
func (d *Driver) StopVM(ctx context.Context, cid string) error {
	return d.power(ctx, cid, "stop", "SHUTOFF", func(ctx context.Context, sc *gophercloud.ServiceClient, id string) error {
		return servers.Stop(ctx, sc, id).ExtractErr()
	})
}

// StartVM powers the server on and waits for ACTIVE.
func (d *Driver) StartVM(ctx context.Context, cid string) error {
	return d.power(ctx, cid, "start", "ACTIVE", func(ctx context.Context, sc *gophercloud.ServiceClient, id string) error {
		return servers.Start(ctx, sc, id).ExtractErr()
	})
}

func (d *Driver) power(ctx context.Context, cid, op, want string, fn func(context.Context, *gophercloud.ServiceClient, string) error) error {
	id, err := validCID("vm", cid)
	if err != nil {
		return err
	}
	s, err := d.server(ctx, id)
	if err != nil {
		return err
	}
	if s.Status == want {
		return nil
	}
	_, err = d.do(ctx, "compute", op+" server "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		err := fn(ctx, sc, id)
		if status(err) == 409 {
			// Already on its way (a resent request, or another caller).
			return nil
		}
		return err
	})
	if isNotFound(err) {
		return fmt.Errorf("server %s: %w", id, driver.ErrVMNotFound)
	}
	if err != nil {
		return d.cloudErr(op+" server "+id, err)
	}
	_, err = d.waitServer(ctx, id, want)
	return err
}

// SetVMMetadata merges md into the server's metadata (clipped to Nova's
// limits) and names the server after md["name"] when given.
func (d *Driver) SetVMMetadata(ctx context.Context, cid string, md map[string]string) (err error) {
	id, err := validCID("vm", cid)
	if err != nil {
		return err
	}
	unlock, err := d.locks.Lock(ctx, vmLock(id))
	if err != nil {
		return err
	}
	defer func() { d.locks.Release(vmLock(id), unlock, errors.Is(err, driver.ErrVMNotFound)) }()
	clean := metadata(md)
	for _, k := range []string{mdVM, mdToken, mdPorts} {
		delete(clean, k) // the driver's own keys are not the caller's to change
	}
	_, err = d.do(ctx, "compute", "update metadata of "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		_, err := servers.UpdateMetadata(ctx, sc, id, servers.MetadataOpts(clean)).Extract()
		return err
	})
	if isNotFound(err) {
		return fmt.Errorf("server %s: %w", id, driver.ErrVMNotFound)
	}
	if err != nil {
		return d.cloudErr("update metadata of "+id, err)
	}
	name := md["name"]
	if name == "" && md["job"] != "" && md["index"] != "" {
		name = md["job"] + "/" + md["index"]
	}
	if name == "" {
		return nil
	}
	_, err = d.do(ctx, "compute", "rename "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		_, err := servers.Update(ctx, sc, id, servers.UpdateOpts{Name: truncate(name, 255)}).Extract()
		return err
	})
	if err != nil {
		return d.cloudErr("rename "+id, err)
	}
	return nil
}

func vmLock(id string) string { return "openstack-vm-" + id }

// ListVMs finds servers carrying every tag in match (Nova's tag filter).
func (d *Driver) ListVMs(ctx context.Context, match map[string]string) ([]driver.VMInfo, error) {
	var list []servers.Server
	tags := serverTags(match)
	sort.Strings(tags)
	_, err := d.do(ctx, "compute", "list servers", func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		pages, err := servers.List(sc, servers.ListOpts{Tags: strings.Join(tags, ",")}).AllPages(ctx)
		if err != nil {
			return err
		}
		list, err = servers.ExtractServers(pages)
		return err
	})
	if err != nil {
		return nil, d.cloudErr("list servers", err)
	}
	var out []driver.VMInfo
	for _, s := range list {
		if s.Status == "DELETED" || s.Status == "SOFT_DELETED" {
			continue
		}
		state := "unknown"
		switch s.Status {
		case "ACTIVE", "BUILD", "REBOOT", "HARD_REBOOT":
			state = "running"
		case "SHUTOFF", "STOPPED", "SUSPENDED", "PAUSED", "SHELVED", "SHELVED_OFFLOADED":
			state = "stopped"
		case "ERROR":
			state = "error"
		}
		tagMap := map[string]string{}
		if s.Tags != nil {
			for _, t := range *s.Tags {
				if k, v, ok := strings.Cut(t, tagSep); ok {
					tagMap[k] = v
				}
			}
		}
		out = append(out, driver.VMInfo{CID: s.ID, AgentID: s.Metadata[mdAgent], Tags: tagMap, Metadata: s.Metadata, State: state})
	}
	return out, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// securityGroupIDs resolves names (ids pass through) for Neutron ports.
func (d *Driver) securityGroupIDs(ctx context.Context, names []string) ([]string, error) {
	var out []string
	for _, g := range names {
		if uuid.Validate(g) == nil && len(g) == 36 {
			out = append(out, g)
			continue
		}
		var found []groups.SecGroup
		_, err := d.do(ctx, "network", "find security group "+g, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
			pages, err := groups.List(sc, groups.ListOpts{Name: g}).AllPages(ctx)
			if err != nil {
				return err
			}
			found, err = groups.ExtractGroups(pages)
			return err
		})
		if err != nil {
			return nil, d.cloudErr("find security group "+g, err)
		}
		if len(found) != 1 {
			return nil, driver.Invalid("security group %q: %d groups have that name", g, len(found))
		}
		out = append(out, found[0].ID)
	}
	return out, nil
}
