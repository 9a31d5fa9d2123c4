package openstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/runway-cpi/runway/src/driver"
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
	unlock, err := d.locks.Lock(ctx, createLock(pl.name))
	if err != nil {
		return driver.VM{}, d.creationError(err)
	}
	defer d.locks.Release(createLock(pl.name), unlock, true)

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
}

// planVM checks the request and resolves names, touching nothing.
func (d *Driver) planVM(ctx context.Context, spec driver.VMSpec) (*vmPlan, error) {
	pl := &vmPlan{name: spec.Name, agent: spec.AgentID, asked: spec.Networks}
	if err := spec.CloudProps.Decode("cloud_properties", &pl.props); err != nil {
		return nil, err
	}
	p := &pl.props
	if err := p.validate(); err != nil {
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
	pl.creator = driver.MergeTags(p.Tags, spec.Tags)
	if spec.AgentID != "" {
		pl.creator[mdAgent] = spec.AgentID
	}
	pl.md = metadata(pl.creator)
	pl.md[mdVM] = pl.name
	pl.md[mdToken] = uuid.NewString()

	if pl.nets, err = planNetworks(spec.Networks); err != nil {
		return nil, err
	}
	netIDs := map[string]string{}
	for _, n := range pl.nets {
		netIDs[n.name] = n.props.NetID
	}
	if len(netIDs) > 0 {
		pl.md[mdNetworks] = driver.EncodeNames(netIDs, 255)
	}
	pl.groups = p.SecurityGroups
	for _, n := range pl.nets {
		pl.groups = append(pl.groups, n.props.SecurityGroups...)
	}
	if len(pl.groups) == 0 {
		pl.groups = d.cfg.DefaultSecurityGroups
	}
	pl.user = p.UserData
	if pl.user == "" {
		if s, ok := spec.Env["user_data"].(string); ok {
			pl.user = s
		} else {
			pl.user = string(withUseDHCP(spec.AgentSettings, d.cfg.useDHCP()))
		}
	}
	if len(pl.user) > 65535 {
		return nil, driver.Invalid("user data is %d bytes; Nova allows 65535", len(pl.user))
	}
	if d.bootFromVolume(p) && (p.RootDisk == nil || mibToGiB(p.RootDisk.SizeMiB) == 0) {
		return nil, &driver.CreationError{Err: driver.Invalid("boot_from_volume needs cloud_properties.root_disk.size")}
	}
	pl.keyName = firstNonEmpty(p.KeyName, d.cfg.DefaultKeyName)
	pl.flavor, err = d.flavorID(ctx, p.InstanceType, false)
	if errors.Is(err, errUnknownFlavor) {
		return nil, err // a CloudError: no retry can find it
	}
	if err != nil {
		return nil, d.creationError(err)
	}
	return pl, nil
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
	srv, err := d.bootServer(ctx, c, pl, d.serverOpts(pl, nics))
	if err != nil {
		return driver.VM{}, d.creationError(err)
	}
	d.log.Info("openstack", "creating server %s (%s) for agent %s", srv.ID, c.name, pl.agent)
	srv, err = d.waitServer(ctx, srv.ID, "ACTIVE")
	if err != nil {
		return driver.VM{}, d.creationError(err)
	}
	out, err := d.assignedNetworks(ctx, srv, pl.asked, pl.nets)
	if err != nil {
		return driver.VM{}, d.creationError(err)
	}
	c.done = true
	return driver.VM{CID: srv.ID, Networks: out}, nil
}

// serverOpts is the server request: NICs, security groups (Nova applies
// them only to ports it makes; ours carry them), user data, config
// drive, and the root volume when booting from one.
func (d *Driver) serverOpts(pl *vmPlan, nics []servers.Network) servers.CreateOpts {
	p := &pl.props
	opts := servers.CreateOpts{
		Name: pl.name, ImageRef: pl.image, FlavorRef: pl.flavor, AvailabilityZone: p.AvailabilityZone,
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
			DestinationType: servers.DestinationVolume, VolumeSize: mibToGiB(p.RootDisk.SizeMiB),
			VolumeType: p.RootDisk.Type, DeleteOnTermination: true}}
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
		if id, ferr := d.flavorID(ctx, pl.props.InstanceType, true); ferr == nil && id != opts.FlavorRef {
			opts.FlavorRef = id
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

// withUseDHCP writes use_dhcp into every non-vip network of the agent
// settings, as the official CPI does (openstack.use_dhcp, default true).
func withUseDHCP(settings []byte, on bool) []byte {
	var s map[string]any
	if json.Unmarshal(settings, &s) != nil {
		return settings
	}
	nets, _ := s["networks"].(map[string]any)
	if len(nets) == 0 {
		return settings
	}
	for _, n := range nets {
		if m, ok := n.(map[string]any); ok && m["type"] != "vip" {
			m["use_dhcp"] = on
		}
	}
	b, err := json.Marshal(s)
	if err != nil {
		return settings
	}
	return b
}
