package openstack

import (
	"context"
	"fmt"
	"net"
	"sort"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/listeners"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/loadbalancers"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/pools"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/runway-cpi/runway/src/driver"
)

// mdPoolPrefix marks a pool membership in the server's metadata, as the
// official CPI records it: lbaas_pool_<n> = <pool id>/<member id>.
const mdPoolPrefix = "lbaas_pool_"

// plannedPool is a loadbalancer_pools entry resolved before anything is
// made: an unknown or ambiguous pool name fails create_vm up front.
type plannedPool struct {
	lbPool
	id, lb string
}

// planPools resolves the pools by name (and their load balancer).
func (d *Driver) planPools(ctx context.Context, pl *vmPlan) error {
	if len(pl.props.LoadbalancerPools) == 0 {
		return nil
	}
	if pl.gateway == nil {
		return &driver.CreationError{Err: driver.Invalid("cloud_properties.loadbalancer_pools needs the VM's gateway network: one manual or dynamic network, or the one whose default has gateway")}
	}
	for _, want := range pl.props.LoadbalancerPools {
		var found []pools.Pool
		_, err := d.do(ctx, "load-balancer", "find pool "+want.Name, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
			var err error
			found, err = all(ctx, pools.List(sc, pools.ListOpts{Name: want.Name}), pools.ExtractPools)
			return err
		})
		if err != nil {
			return d.creationError(d.cloudErr("find load balancer pool "+want.Name, err))
		}
		if len(found) != 1 {
			return &driver.CreationError{Err: driver.Invalid("cloud_properties.loadbalancer_pools: %d pools are named %q; want exactly one", len(found), want.Name)}
		}
		p := plannedPool{lbPool: want, id: found[0].ID}
		switch {
		case len(found[0].Loadbalancers) > 0:
			p.lb = found[0].Loadbalancers[0].ID
		case len(found[0].Listeners) == 1:
			var l *listeners.Listener
			_, err := d.do(ctx, "load-balancer", "get listener", func(ctx context.Context, sc *gophercloud.ServiceClient) error {
				var err error
				l, err = listeners.Get(ctx, sc, found[0].Listeners[0].ID).Extract()
				return err
			})
			if err != nil {
				return d.creationError(d.cloudErr("get the listener of pool "+want.Name, err))
			}
			if len(l.Loadbalancers) > 0 {
				p.lb = l.Loadbalancers[0].ID
			}
		}
		if p.lb == "" {
			return &driver.CreationError{Err: driver.Invalid("load balancer pool %q belongs to no load balancer (through one listener)", want.Name)}
		}
		pl.pools = append(pl.pools, p)
	}
	return nil
}

// joinPools makes the VM's gateway address a member of each pool and
// records the memberships in the server's metadata (delete_vm reads
// them back). Members made before a failure are in c.members for undo.
func (d *Driver) joinPools(ctx context.Context, c *creation, srv *servers.Server, pl *vmPlan, ip string) error {
	if len(pl.pools) == 0 {
		return nil
	}
	subnet, err := d.subnetFor(ctx, pl.gateway.props.NetID, ip)
	if err != nil {
		return err
	}
	md := map[string]string{}
	for i, p := range pl.pools {
		opts := pools.CreateMemberOpts{Address: ip, ProtocolPort: p.Port, SubnetID: subnet, Name: c.name, MonitorPort: p.MonitoringPort}
		var member *pools.Member
		err := d.whileLBBusy(ctx, p.lb, "add "+ip+" to pool "+p.Name, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
			var err error
			member, err = pools.CreateMember(ctx, sc, p.id, opts).Extract()
			if is409(err) && strings.Contains(strings.ToLower(apiMessage(err)), "duplicate") {
				// A resent POST that took effect, or our address already
				// there: adopt the member with our address and port.
				member, err = d.findMember(ctx, sc, p.id, ip, p.Port)
			}
			return err
		})
		if err != nil {
			return d.creationError(fmt.Errorf("VM %s cannot join load balancer pool %q: %w", srv.ID, p.Name, err))
		}
		c.members = append(c.members, [3]string{p.id, member.ID, p.lb})
		md[fmt.Sprintf("%s%d", mdPoolPrefix, i+1)] = p.id + "/" + member.ID
		d.Log.Info("joined a pool", "server", srv.ID, "pool", p.Name, "pool_id", p.id, "member", member.ID, "address", fmt.Sprintf("%s:%d", ip, p.Port))
	}
	_, err = d.do(ctx, "compute", "record pool memberships of "+srv.ID, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		_, err := servers.UpdateMetadata(ctx, sc, srv.ID, servers.MetadataOpts(md)).Extract()
		return err
	})
	if err != nil {
		return d.creationError(d.cloudErr("record pool memberships of "+srv.ID, err))
	}
	return nil
}

// leavePools removes the memberships recorded in md; a member or pool
// already gone is fine.
func (d *Driver) leavePools(ctx context.Context, md map[string]string) error {
	keys := make([]string, 0, len(md))
	for k := range md {
		if strings.HasPrefix(k, mdPoolPrefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		pool, member, ok := strings.Cut(md[k], "/")
		if !ok {
			continue
		}
		if err := d.leavePool(ctx, pool, member, ""); err != nil {
			return err
		}
	}
	return nil
}

func (d *Driver) leavePool(ctx context.Context, pool, member, lb string) error {
	remove := func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		err := pools.DeleteMember(ctx, sc, pool, member).ExtractErr()
		if isNotFound(err) {
			return nil // the member (or its pool) is gone already
		}
		return err
	}
	_, err := d.do(ctx, "load-balancer", "remove member "+member+" from pool "+pool, remove)
	if is409(err) {
		// Busy: wait on its load balancer, found through the pool.
		if lb == "" {
			_, gerr := d.do(ctx, "load-balancer", "get pool "+pool, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
				p, err := pools.Get(ctx, sc, pool).Extract()
				if err == nil && len(p.Loadbalancers) > 0 {
					lb = p.Loadbalancers[0].ID
				}
				return err
			})
			if gerr != nil && !isNotFound(gerr) {
				return d.cloudErr("get pool "+pool, gerr)
			}
		}
		err = d.whileLBBusy(ctx, lb, "remove member "+member+" from pool "+pool, remove)
	}
	if err != nil {
		return d.cloudErr("remove member "+member+" from pool "+pool, err)
	}
	d.Log.Info("left a pool", "member", member, "pool", pool)
	return nil
}

// whileLBBusy runs op; while the load balancer answers 409 (another
// change is being applied: PENDING_UPDATE) it waits for the load balancer
// to settle and runs op again.
func (d *Driver) whileLBBusy(ctx context.Context, lb, what string, op func(context.Context, *gophercloud.ServiceClient) error) error {
	_, err := d.do(ctx, "load-balancer", what, op)
	if !is409(err) {
		return err
	}
	last := err
	err = d.waitFor(ctx, what, func(ctx context.Context) (bool, error) {
		if lb != "" {
			var l *loadbalancers.LoadBalancer
			_, err := d.do(ctx, "load-balancer", "get load balancer "+lb, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
				var err error
				l, err = loadbalancers.Get(ctx, sc, lb).Extract()
				return err
			})
			if err != nil && !isNotFound(err) {
				return false, err
			}
			if l != nil && strings.HasPrefix(l.ProvisioningStatus, "PENDING") {
				return false, nil
			}
			if l != nil && l.ProvisioningStatus == "ERROR" {
				return false, fmt.Errorf("load balancer %s is in ERROR", lb)
			}
		}
		_, err := d.do(ctx, "load-balancer", what, op)
		if is409(err) {
			last = err
			return false, nil
		}
		return err == nil, err
	})
	if err != nil && is409(last) {
		return fmt.Errorf("%w (last: %v)", err, last)
	}
	return err
}

// findMember is the pool's member with this address and port.
func (d *Driver) findMember(ctx context.Context, sc *gophercloud.ServiceClient, pool, ip string, port int) (*pools.Member, error) {
	list, err := all(ctx, pools.ListMembers(sc, pool, pools.ListMembersOpts{Address: ip, ProtocolPort: port}), pools.ExtractMembers)
	if err != nil {
		return nil, err
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("pool %s: a member %s:%d supposedly exists but cannot be found", pool, ip, port)
	}
	return &list[0], nil
}

// subnetFor is the subnet of network whose range holds ip.
func (d *Driver) subnetFor(ctx context.Context, network, ip string) (string, error) {
	list, err := read(ctx, d, "network", "list subnets of "+network, nil, func(ctx context.Context, sc *gophercloud.ServiceClient) ([]subnets.Subnet, error) {
		return all(ctx, subnets.List(sc, subnets.ListOpts{NetworkID: network}), subnets.ExtractSubnets)
	})
	if err != nil {
		return "", err
	}
	addr := net.ParseIP(ip)
	id := ""
	for _, s := range list {
		if _, cidr, perr := net.ParseCIDR(s.CIDR); perr == nil && addr != nil && cidr.Contains(addr) {
			id = s.ID
		}
	}
	if id == "" {
		return "", fmt.Errorf("openstack: no subnet of network %s holds %s", network, ip)
	}
	return id, nil
}
