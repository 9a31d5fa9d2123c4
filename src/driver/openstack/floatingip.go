package openstack

import (
	"context"
	"fmt"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/runway-cpi/runway/src/driver"
)

// associateFloatingIP gives the server the vip network's address, with
// the official CPI's semantics: the floating IP is allocated beforehand
// (runway finds it by address, it never allocates one), and one held by
// another port is moved to this server's port on its gateway network.
// Deleting the port (delete_vm) frees it again.
func (d *Driver) associateFloatingIP(ctx context.Context, srv *servers.Server, pl *vmPlan) error {
	ip := pl.vip.net.IP
	var fip floatingips.FloatingIP
	_, err := d.do(ctx, "network", "find floating IP "+ip, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		list, err := all(ctx, floatingips.List(sc, floatingips.ListOpts{FloatingIP: ip}), floatingips.ExtractFloatingIPs)
		if err != nil {
			return err
		}
		switch len(list) {
		case 0:
			return driver.Invalid("%s: floating IP %s is not allocated to this project (allocate it first: openstack floating ip create --floating-ip-address %s <network>)",
				describeNet(pl.vip.name, pl.vip.net), ip, ip)
		case 1:
			fip = list[0]
			return nil
		}
		var nets []string
		for _, f := range list {
			nets = append(nets, f.FloatingNetworkID)
		}
		return driver.Invalid("floating IP %s is in several networks: %s", ip, strings.Join(nets, ", "))
	})
	if err != nil {
		return d.cloudErr("find floating IP "+ip, err)
	}
	port := pl.gateway.port
	if port == "" {
		// A dynamic network: the port is Nova's.
		if port, err = d.serverPort(ctx, srv.ID, pl.gateway.props.NetID); err != nil {
			return err
		}
	}
	if fip.PortID == port {
		return nil // a retried create: done already
	}
	if fip.PortID != "" {
		d.Log.Info("moving a floating IP", "ip", ip, "from_port", fip.PortID, "server", srv.ID)
	}
	_, err = d.do(ctx, "network", "associate floating IP "+ip, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		_, err := floatingips.Update(ctx, sc, fip.ID, floatingips.UpdateOpts{PortID: &port}).Extract()
		return err
	})
	if err != nil {
		return d.cloudErr(fmt.Sprintf("associate floating IP %s with port %s", ip, port), err)
	}
	d.Log.Info("floating IP associated", "ip", ip, "server", srv.ID, "port", port)
	return nil
}

// serverPort is the server's port on network.
func (d *Driver) serverPort(ctx context.Context, server, network string) (string, error) {
	list, err := read(ctx, d, "network", "find the port of server "+server, nil, func(ctx context.Context, sc *gophercloud.ServiceClient) ([]ports.Port, error) {
		return all(ctx, ports.List(sc, ports.ListOpts{DeviceID: server, NetworkID: network}), ports.ExtractPorts)
	})
	if err != nil {
		return "", err
	}
	if len(list) == 0 {
		return "", fmt.Errorf("openstack: server %s has no port on network %s", server, network)
	}
	return list[0].ID, nil
}
