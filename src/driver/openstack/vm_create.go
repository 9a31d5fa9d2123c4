package openstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/cloudtags"
	"github.com/runway-cpi/runway/src/retry"
)

// CreateVM boots one server and waits until it is ACTIVE. On any failure
// the server(s) and ports this call made are deleted.
func (d *Driver) CreateVM(ctx context.Context, spec driver.VMSpec) (driver.VM, error) {
	pl, err := d.planVM(ctx, spec)
	if err != nil {
		return driver.VM{}, err
	}
	// The create's lock is held while its ports may be unbound: a port
	// another process finds unbound is reclaimed only when this lock (on
	// this host) is free, or the port is older than any create lasts.
	unlock, err := d.Locks.Lock(ctx, createLock(pl.name))
	if err != nil {
		return driver.VM{}, d.creationError(err)
	}
	defer d.Locks.Release(createLock(pl.name), unlock, true)

	// From here on, whatever exists is removed if the call fails.
	c := &creation{d: d, name: pl.name, token: pl.md[mdToken]}
	vm, err := d.createServer(ctx, c, pl)
	if err != nil {
		c.undo(context.WithoutCancel(ctx))
		return driver.VM{}, err
	}
	return vm, nil
}

// vmPlan is what create_vm decided before it makes anything.
type vmPlan struct {
	name    string
	agent   string
	props   vmProps
	md      map[string]string // server metadata (creator tags, runway's keys)
	creator map[string]string // creator tags: Nova and Neutron tags
	asked   driver.Networks   // the networks hash, answered with addresses
	nets    []plannedNet
	groups  []string
	user    string // user data
	image   string
	flavor  string
	keyName string
	rootGiB int // boot volume size, when booting from one
	// zones are tried in turn (availability_zones, shuffled); "" lets
	// Nova pick.
	zones   []string
	gateway *plannedNet // the network of the floating IP, VRRP address, pool members
	vip     *plannedNet // the floating IP, if any
	pair    string      // allowed_address_pairs on the gateway port
	pools   []plannedPool
}

// planVM checks the request and resolves names, touching nothing.
func (d *Driver) planVM(ctx context.Context, spec driver.VMSpec) (*vmPlan, error) {
	pl := &vmPlan{name: spec.Name, agent: spec.AgentID, asked: spec.Networks}
	if err := spec.CloudProps.Decode("cloud_properties", &pl.props); err != nil {
		return nil, err
	}
	p := &pl.props
	if err := p.validate(d.cfg.IgnoreServerAvailabilityZone); err != nil {
		return nil, err
	}
	image, err := validCID("stemcell", spec.StemcellCID)
	if err != nil {
		return nil, &driver.CreationError{Err: fmt.Errorf("%w: %w", driver.ErrStemcellNotFound, err)}
	}
	pl.image = image
	if pl.name == "" {
		pl.name = "vm-" + uuid.NewString()
	}
	pl.creator = cloudtags.Merge(p.Tags, spec.Tags)
	if spec.AgentID != "" {
		pl.creator[mdAgent] = spec.AgentID
	}
	pl.md = metadata(pl.creator)
	pl.md[mdVM] = pl.name
	pl.md[mdToken] = uuid.NewString()

	if pl.nets, pl.vip, err = planNetworks(spec.Networks); err != nil {
		return nil, err
	}
	pl.gateway = gatewayNet(pl.nets)
	netIDs := map[string]string{}
	for _, n := range pl.nets {
		netIDs[n.name] = n.props.NetID
	}
	if len(netIDs) > 0 {
		pl.md[mdNetworks] = cloudtags.EncodeNames(netIDs, 255)
	}
	pl.groups = p.SecurityGroups
	for _, n := range pl.nets {
		pl.groups = append(pl.groups, n.props.SecurityGroups...)
	}
	if pl.vip != nil {
		pl.groups = append(pl.groups, pl.vip.props.SecurityGroups...)
	}
	if len(pl.groups) == 0 {
		pl.groups = d.cfg.DefaultSecurityGroups
	}
	pl.groups = uniq(pl.groups)
	if err := d.planPair(ctx, pl); err != nil {
		return nil, err
	}
	if err := d.planPools(ctx, pl); err != nil {
		return nil, err
	}
	if pl.zones, err = d.planZones(ctx, p, spec.DiskCIDs); err != nil {
		return nil, err
	}
	pl.keyName = firstNonEmpty(p.KeyName, d.cfg.DefaultKeyName)
	flavor, err := d.flavor(ctx, p.InstanceType, false)
	if errors.Is(err, errUnknownFlavor) {
		return nil, err // a CloudError: no retry can find it
	}
	if err != nil {
		return nil, d.creationError(err)
	}
	pl.flavor = flavor.ID
	if d.bootFromVolume(p) {
		// The official CPI's rule: root_disk.size (GiB), else the flavor's disk.
		if p.RootDisk != nil {
			pl.rootGiB = p.RootDisk.SizeGiB
		} else if pl.rootGiB = flavor.Disk; pl.rootGiB == 0 {
			return nil, &driver.CreationError{Err: driver.Invalid("boot_from_volume: flavor %q has a root disk of 0 GiB; set cloud_properties.root_disk.size (GiB) or pick another flavor", flavor.Name)}
		}
	}
	pl.user = p.UserData
	if pl.user == "" {
		if s, ok := spec.Env["user_data"].(string); ok {
			pl.user = s
		} else {
			pl.user = string(agentUserData(spec.AgentSettings, d.cfg.useDHCP(), flavor.Ephemeral > 0))
		}
	}
	if len(pl.user) > 65535 {
		return nil, driver.Invalid("user data is %d bytes; Nova allows 65535", len(pl.user))
	}
	return pl, nil
}

// planPair checks allowed_address_pairs: it goes on the gateway network's
// port, which must be one runway makes (manual), and by default the VRRP
// address must already be some port's (vrrp_port_check, as the official
// CPI checks).
func (d *Driver) planPair(ctx context.Context, pl *vmPlan) error {
	pl.pair = pl.props.AllowedAddressPairs
	if pl.pair == "" {
		return nil
	}
	if pl.gateway == nil || pl.gateway.net.Type != "manual" {
		return &driver.CreationError{Err: driver.Invalid("cloud_properties.allowed_address_pairs needs a manual gateway network (its port carries the pair)")}
	}
	check := true
	for _, c := range []*bool{pl.props.VRRPPortCheck, pl.gateway.props.VRRPPortCheck} {
		if c != nil && !*c {
			check = false
		}
	}
	if !check {
		return nil
	}
	list, err := read(ctx, d, "network", "find the VRRP port of "+pl.pair, nil, func(ctx context.Context, sc *gophercloud.ServiceClient) ([]ports.Port, error) {
		return all(ctx, ports.List(sc, ports.ListOpts{FixedIPs: []ports.FixedIPOpts{{IPAddress: pl.pair}}}), ports.ExtractPorts)
	})
	if err != nil {
		return d.creationError(err)
	}
	if len(list) == 0 {
		return &driver.CreationError{Err: driver.Invalid("cloud_properties.allowed_address_pairs: no port holds %s (the VRRP address); create that port first, or set vrrp_port_check: false", pl.pair)}
	}
	return nil
}

// planZones lists the zones to try. A VM with persistent disks goes to
// their zone unless openstack.ignore_server_availability_zone, as the
// official CPI places it; availability_zones are tried in random order.
func (d *Driver) planZones(ctx context.Context, p *vmProps, disks []string) ([]string, error) {
	if len(p.AvailabilityZones) > 0 {
		zones := slices.Clone(p.AvailabilityZones)
		rand.Shuffle(len(zones), func(i, j int) { zones[i], zones[j] = zones[j], zones[i] })
		return zones, nil
	}
	if len(disks) == 0 || d.cfg.IgnoreServerAvailabilityZone {
		return []string{p.AvailabilityZone}, nil
	}
	zone, seen := p.AvailabilityZone, []string{}
	for _, cid := range disks {
		id, err := validCID("disk", cid)
		if err != nil {
			return nil, &driver.CreationError{Err: err}
		}
		v, err := d.volume(ctx, id)
		if err != nil {
			return nil, d.creationError(err)
		}
		seen = append(seen, fmt.Sprintf("disk %s is in zone %q", id, v.AvailabilityZone))
		if zone == "" {
			zone = v.AvailabilityZone
		}
		if v.AvailabilityZone != zone {
			vmZone := "the VM's zone is " + strconv.Quote(p.AvailabilityZone)
			if p.AvailabilityZone == "" {
				vmZone = "the disks disagree"
			}
			return nil, &driver.CreationError{Err: driver.Invalid("VM and disks in different availability zones (%s; %s): use one zone, or set openstack.ignore_server_availability_zone: true",
				vmZone, strings.Join(seen, ", "))}
		}
	}
	return []string{zone}, nil
}

func uniq(list []string) []string {
	var out []string
	for _, s := range list {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

func (d *Driver) bootFromVolume(p *vmProps) bool {
	if p.BootFromVolume != nil {
		return *p.BootFromVolume
	}
	return d.cfg.BootFromVolume
}

// createServer makes the ports, boots the server, waits for ACTIVE and
// answers the networks with the addresses the server got.
func (d *Driver) createServer(ctx context.Context, c *creation, pl *vmPlan) (driver.VM, error) {
	nics, err := d.createPorts(ctx, c, pl)
	if err != nil {
		return driver.VM{}, d.creationError(err)
	}
	var srv *servers.Server
	for i, zone := range pl.zones {
		srv, err = d.bootInZone(ctx, c, pl, nics, zone)
		if err == nil || i == len(pl.zones)-1 || ctx.Err() != nil {
			break
		}
		// The official CPI's availability_zones: another zone may have room.
		d.Log.Warn("create failed in a zone; trying the next", "vm", c.name, "zone", zone, "next_zone", pl.zones[i+1], "err", err)
		c.d.sweepServers(context.WithoutCancel(ctx), c.name, c.token, "")
		c.server, c.sent = "", 0
	}
	if err != nil {
		return driver.VM{}, err
	}
	if pl.vip != nil {
		if err := d.associateFloatingIP(ctx, srv, pl); err != nil {
			return driver.VM{}, d.creationError(err)
		}
	}
	out, err := d.assignedNetworks(ctx, srv, pl.asked, pl.nets)
	if err != nil {
		return driver.VM{}, d.creationError(err)
	}
	if len(pl.pools) > 0 {
		if err := d.joinPools(ctx, c, srv, pl, out[pl.gateway.name].IP); err != nil {
			return driver.VM{}, err
		}
	}
	c.done = true
	return driver.VM{CID: srv.ID, Networks: out}, nil
}

// bootInZone boots the server in zone and waits until it is ACTIVE.
func (d *Driver) bootInZone(ctx context.Context, c *creation, pl *vmPlan, nics []servers.Network, zone string) (*servers.Server, error) {
	opts := d.serverOpts(pl, nics)
	opts.AvailabilityZone = zone
	srv, err := d.bootServer(ctx, c, pl, opts)
	if err != nil {
		return nil, d.creationError(err)
	}
	d.Log.Info("creating server", "server", srv.ID, "name", c.name, "agent", pl.agent, "zone", zone)
	srv, err = d.waitServer(ctx, srv.ID, "ACTIVE")
	if err != nil {
		return nil, d.creationError(err)
	}
	return srv, nil
}

// serverOpts is the server request: NICs, security groups (Nova applies
// them only to ports it makes; ours carry them), user data, config
// drive, and the root volume when booting from one.
func (d *Driver) serverOpts(pl *vmPlan, nics []servers.Network) servers.CreateOpts {
	p := &pl.props
	opts := servers.CreateOpts{
		Name: pl.name, ImageRef: pl.image, FlavorRef: pl.flavor,
		Metadata: pl.md, Tags: serverTags(pl.creator), SecurityGroups: pl.groups, Networks: "none",
	}
	if len(pl.nets) == 0 || allPorts(pl.nets) {
		opts.SecurityGroups = nil
	}
	if len(nics) > 0 {
		opts.Networks = nics
	}
	if pl.user != "" {
		opts.UserData = []byte(pl.user)
	}
	if cd := p.ConfigDrive; cd != nil && *cd || cd == nil && d.cfg.ConfigDrive.Enabled() {
		opts.ConfigDrive = gophercloud.Enabled
	}
	if d.bootFromVolume(p) {
		opts.ImageRef = ""
		opts.BlockDevice = []servers.BlockDevice{{SourceType: servers.SourceImage, UUID: pl.image, BootIndex: 0,
			DestinationType: servers.DestinationVolume, VolumeSize: pl.rootGiB,
			VolumeType: rootType(p.RootDisk), DeleteOnTermination: true}}
	}
	return opts
}

// bootServer sends the server POST (a lost answer is found by the call's
// token rather than resent blindly); a stale cached flavor id is looked
// up again once. Duplicates a resent POST made are deleted.
func (d *Driver) bootServer(ctx context.Context, c *creation, pl *vmPlan, opts servers.CreateOpts) (*servers.Server, error) {
	var srv *servers.Server
	create := func() (int, error) {
		var builder servers.CreateOptsBuilder = opts
		if pl.keyName != "" {
			builder = keypairs.CreateOptsExt{CreateOptsBuilder: opts, KeyName: pl.keyName}
		}
		return d.doCreate(ctx, "compute", "create server "+c.name, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
			var err error
			var hints servers.SchedulerHintOptsBuilder
			if len(pl.props.SchedulerHints) > 0 {
				hints = pl.props.SchedulerHints
			}
			srv, err = servers.Create(ctx, sc, builder, hints).Extract()
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
		if f, ferr := d.flavor(ctx, pl.props.InstanceType, true); ferr == nil && f.ID != opts.FlavorRef {
			opts.FlavorRef = f.ID
			var n int
			n, err = create()
			sent += n
		}
	}
	c.sent = sent
	if err != nil {
		return nil, d.cloudErr("create server "+c.name, err)
	}
	c.server = srv.ID
	if sent > 1 {
		// A resent POST may have booted twice: keep only this one.
		d.sweepServers(ctx, c.name, c.token, srv.ID)
	}
	return srv, nil
}

// creation remembers what a create_vm made, to undo it on failure.
type creation struct {
	d      *Driver
	name   string
	token  string
	sent   int
	server string
	ports  []string
	// members are pool memberships made: pool, member, load balancer.
	members [][3]string
	done    bool
}

func (c *creation) undo(ctx context.Context) {
	if c.done {
		return
	}
	for _, m := range c.members {
		if err := c.d.leavePool(ctx, m[0], m[1], m[2]); err != nil {
			c.d.Log.Warn("removing a pool member after a failed create failed", "member", m[1], "pool", m[0], "err", err)
		}
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
			c.d.Log.Warn("deleting a port after a failed create failed", "port", p, "err", err)
		}
	}
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

// agentUserData adjusts the agent settings as the official CPI writes
// them: use_dhcp on every non-vip network (openstack.use_dhcp, default
// true), and no ephemeral disk when the flavor has none (the agent then
// keeps its data on the root disk instead of waiting for /dev/sdb).
func agentUserData(settings []byte, useDHCP, ephemeral bool) []byte {
	var s map[string]any
	if json.Unmarshal(settings, &s) != nil {
		return settings
	}
	nets, _ := s["networks"].(map[string]any)
	for _, n := range nets {
		if m, ok := n.(map[string]any); ok && m["type"] != "vip" {
			m["use_dhcp"] = useDHCP
		}
	}
	if disks, ok := s["disks"].(map[string]any); ok && !ephemeral {
		disks["ephemeral"] = nil
	}
	b, err := json.Marshal(s)
	if err != nil {
		return settings
	}
	return b
}

func rootType(r *rootDisk) string {
	if r == nil {
		return ""
	}
	return r.Type
}
