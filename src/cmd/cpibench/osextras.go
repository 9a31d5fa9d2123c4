package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/listeners"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/loadbalancers"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/pools"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
)

// withFloatingIPAndPool makes what the official CPI expects an operator
// to have made (a floating IP, an Octavia pool behind a listener) and
// gives every VM of the suite a vip network and loadbalancer_pools, so
// the timings include both. The returned cleanup deletes them.
func withFloatingIPAndPool(s *cloudSuite) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	opts := gophercloud.AuthOptions{IdentityEndpoint: os.Getenv("OS_AUTH_URL"), Username: os.Getenv("OS_USERNAME"),
		Password: os.Getenv("OS_PASSWORD"), DomainName: os.Getenv("OS_USER_DOMAIN_NAME"),
		Scope: &gophercloud.AuthScope{ProjectName: os.Getenv("OS_PROJECT_NAME"), DomainName: os.Getenv("OS_PROJECT_DOMAIN_NAME")}}
	pc, err := openstack.AuthenticatedClient(ctx, opts)
	if err != nil {
		return nil, err
	}
	eo := gophercloud.EndpointOpts{Region: os.Getenv("OS_REGION_NAME")}
	nc, err := openstack.NewNetworkV2(pc, eo)
	if err != nil {
		return nil, err
	}
	lbc, err := openstack.NewLoadBalancerV2(pc, eo)
	if err != nil {
		return nil, err
	}
	ext, netID := os.Getenv("RUNWAY_OS_EXT_NET_ID"), os.Getenv("RUNWAY_OS_NET_ID")
	if ext == "" {
		return nil, fmt.Errorf("-lb needs RUNWAY_OS_EXT_NET_ID (fixtures.env)")
	}
	fip, err := floatingips.Create(ctx, nc, floatingips.CreateOpts{FloatingNetworkID: ext}).Extract()
	if err != nil {
		return nil, fmt.Errorf("allocating a floating IP: %w", err)
	}
	var lbID string
	cleanup := func() {
		ctx := context.Background()
		floatingips.Delete(ctx, nc, fip.ID)
		if lbID != "" {
			loadbalancers.Delete(ctx, lbc, lbID, loadbalancers.DeleteOpts{Cascade: true})
		}
	}
	fail := func(err error) (func(), error) { cleanup(); return nil, err }
	pages, err := subnets.List(nc, subnets.ListOpts{NetworkID: netID}).AllPages(ctx)
	if err != nil {
		return fail(err)
	}
	sn, err := subnets.ExtractSubnets(pages)
	if err != nil || len(sn) == 0 {
		return fail(fmt.Errorf("network %s has no subnet (%v)", netID, err))
	}
	name := fmt.Sprintf("cpibench-%d", os.Getpid())
	lb, err := loadbalancers.Create(ctx, lbc, loadbalancers.CreateOpts{Name: name, VipSubnetID: sn[0].ID}).Extract()
	if err != nil {
		return fail(fmt.Errorf("creating a load balancer: %w", err))
	}
	lbID = lb.ID
	active := func() error {
		for {
			l, err := loadbalancers.Get(ctx, lbc, lb.ID).Extract()
			if err != nil {
				return err
			}
			if l.ProvisioningStatus == "ACTIVE" {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("load balancer %s: %s: %w", lb.ID, l.ProvisioningStatus, ctx.Err())
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	if err := active(); err != nil {
		return fail(err)
	}
	ls, err := listeners.Create(ctx, lbc, listeners.CreateOpts{Name: name, LoadbalancerID: lb.ID, Protocol: listeners.ProtocolHTTP, ProtocolPort: 80}).Extract()
	if err != nil {
		return fail(err)
	}
	if err := active(); err != nil {
		return fail(err)
	}
	if _, err := pools.Create(ctx, lbc, pools.CreateOpts{Name: name, ListenerID: ls.ID, Protocol: pools.ProtocolHTTP, LBMethod: pools.LBMethodRoundRobin}).Extract(); err != nil {
		return fail(err)
	}
	if err := active(); err != nil {
		return fail(err)
	}
	props := map[string]any{"loadbalancer_pools": []map[string]any{{"name": name, "port": 8080}}}
	for k, v := range s.vmProps {
		props[k] = v
	}
	s.vmProps = props
	nets := map[string]any{"public": map[string]any{"type": "vip", "ip": fip.FloatingIP}}
	for k, v := range s.nets {
		nets[k] = v
	}
	s.nets = nets
	return cleanup, nil
}
