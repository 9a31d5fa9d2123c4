package openstack

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servergroups"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/listeners"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/loadbalancers"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/pools"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/runway-cpi/runway/src/testkit/cpibin"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// officialCaller runs bin/cpi on the dev cloud with a config written with
// the official job's key names, as the Director would.
func officialCaller(t *testing.T, c cloud, director string, extra map[string]any) cpibin.Caller {
	t.Helper()
	dir := t.TempDir()
	section := map[string]any{"auth_url": c.authURL, "username": c.user, "api_key": c.password, "project": c.project,
		"region": c.region, "state_timeout": 120, "wait_resource_poll_interval": 1}
	for k, v := range extra {
		section[k] = v
	}
	cpi := cpibin.Configured(t, dir, "openstack", map[string]any{"driver": "openstack", "state_dir": filepath.Join(dir, "state"), "openstack": section})
	cpi.Secrets = []string{c.password}
	cpi.Context = map[string]any{"director_uuid": director, "vm": map[string]any{"stemcell": map[string]any{"api_version": 2}}}
	return cpi
}

func createVMArgs(agent, stemcell string, props, nets map[string]any, disks []string) []any {
	return []any{agent, stemcell, props, nets, disks, map[string]any{}}
}

// userData is the server's user data as Nova keeps it (admin, 2.3+).
func userData(t *testing.T, a *admin, server string) map[string]any {
	t.Helper()
	sc, err := a.d.client(context.Background(), "compute")
	if err != nil {
		t.Fatal(err)
	}
	v := *sc
	v.Microversion = "2.3"
	var out struct {
		Server map[string]any `json:"server"`
	}
	if _, err := v.Get(context.Background(), v.Endpoint+"servers/"+server, &out, &gophercloud.RequestOpts{OkCodes: []int{200}}); err != nil {
		t.Fatal(err)
	}
	enc, _ := out.Server["OS-EXT-SRV-ATTR:user_data"].(string)
	raw, err := base64.StdEncoding.DecodeString(enc)
	if err != nil {
		t.Fatalf("user data of %s: %v", server, err)
	}
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("user data of %s is not the agent's settings: %s", server, raw)
	}
	return m
}

// newPool makes an Octavia load balancer on the network's subnet with a
// listener and a pool named name, ACTIVE, deleted (cascade) at cleanup.
func newPool(t *testing.T, d *Driver, netID, name string) string {
	t.Helper()
	ctx := context.Background()
	lbc, err := d.client(ctx, "load-balancer")
	if err != nil {
		t.Fatal(err)
	}
	nc, _ := d.client(ctx, "network")
	pages, err := subnets.List(nc, subnets.ListOpts{NetworkID: netID}).AllPages(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sn, _ := subnets.ExtractSubnets(pages)
	if len(sn) == 0 {
		t.Fatalf("network %s has no subnet", netID)
	}
	lb, err := loadbalancers.Create(ctx, lbc, loadbalancers.CreateOpts{Name: name, VipSubnetID: sn[0].ID}).Extract()
	if err != nil {
		t.Fatalf("creating a load balancer: %v", err)
	}
	t.Cleanup(func() {
		loadbalancers.Delete(context.Background(), lbc, lb.ID, loadbalancers.DeleteOpts{Cascade: true})
	})
	active := func() {
		t.Helper()
		if err := d.waitFor(ctx, "load balancer "+lb.ID+" ACTIVE", func(ctx context.Context) (bool, error) {
			l, err := loadbalancers.Get(ctx, lbc, lb.ID).Extract()
			return err == nil && l.ProvisioningStatus == "ACTIVE", err
		}); err != nil {
			t.Fatal(err)
		}
	}
	active()
	ls, err := listeners.Create(ctx, lbc, listeners.CreateOpts{Name: name, LoadbalancerID: lb.ID, Protocol: listeners.ProtocolHTTP, ProtocolPort: 80}).Extract()
	if err != nil {
		t.Fatalf("creating a listener: %v", err)
	}
	active()
	p, err := pools.Create(ctx, lbc, pools.CreateOpts{Name: name, ListenerID: ls.ID, Protocol: pools.ProtocolHTTP, LBMethod: pools.LBMethodRoundRobin}).Extract()
	if err != nil {
		t.Fatalf("creating a pool: %v", err)
	}
	active()
	return p.ID
}

func poolMembers(t *testing.T, d *Driver, pool string) []pools.Member {
	t.Helper()
	lbc, err := d.client(context.Background(), "load-balancer")
	if err != nil {
		t.Fatal(err)
	}
	pages, err := pools.ListMembers(lbc, pool, nil).AllPages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	list, err := pools.ExtractMembers(pages)
	if err != nil {
		t.Fatal(err)
	}
	return list
}

// TestOfficialVMCloudPropertiesOnTheDevCloud drives bin/cpi with the
// official CPI's VM and network cloud properties and checks what Nova and
// Neutron made: a vip network's floating IP (found by address, moved from
// another server, freed by delete_vm), allowed_address_pairs with and
// without vrrp_port_check, scheduler_hints into a server group,
// availability_zones tried in turn, disks keeping the VM in their zone,
// and the ephemeral disk announced only when the flavor has one.
func TestOfficialVMCloudPropertiesOnTheDevCloud(t *testing.T) {
	c := devCloud(t)
	env := testenv.Need(t, "fixtures.env of scripts/openstack-dev (the external network)", "RUNWAY_OS_EXT_NET_ID", "RUNWAY_OS_IMAGE_ID")
	director := "parity-" + uuid.NewString()[:8]
	t.Cleanup(func() { assertNoneTagged(t, c, "director", director) })
	cpi := officialCaller(t, c, director, map[string]any{"ignore_server_availability_zone": true})
	a := newAdmin(t, c)
	user, _ := newTestDriver(t, c, "", "", nil)
	ctx := context.Background()
	net, err := user.client(ctx, "network")
	if err != nil {
		t.Fatal(err)
	}
	compute, err := user.client(ctx, "compute")
	if err != nil {
		t.Fatal(err)
	}

	var sc string
	json.Unmarshal(cpi.OK(t, nil, "create_stemcell", "", map[string]any{"image_id": env[1]}), &sc)
	fip, err := floatingips.Create(ctx, net, floatingips.CreateOpts{FloatingNetworkID: env[0]}).Extract()
	if err != nil {
		t.Fatalf("allocating a floating IP: %v", err)
	}
	t.Cleanup(func() { floatingips.Delete(context.Background(), net, fip.ID) })
	// The VRRP address's own port, as keepalived setups make it.
	vrrp, err := ports.Create(ctx, net, ports.CreateOpts{NetworkID: c.netID, Name: "vrrp-" + director,
		FixedIPs: []ports.IP{{IPAddress: "10.20.0.240"}}}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ports.Delete(context.Background(), net, vrrp.ID) })
	group, err := servergroups.Create(ctx, compute, servergroups.CreateOpts{Name: "parity-" + director, Policies: []string{"anti-affinity"}}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { servergroups.Delete(context.Background(), compute, group.ID) })

	poolName := "parity-" + director
	pool := newPool(t, user, c.netID, poolName)

	nets := func(ip string) map[string]any {
		return map[string]any{
			"private": map[string]any{"type": "manual", "ip": ip, "netmask": "255.255.255.0", "gateway": "10.20.0.1",
				"default": []string{"dns", "gateway"}, "cloud_properties": map[string]any{"net_id": c.netID}},
			"public": map[string]any{"type": "vip", "ip": fip.FloatingIP, "cloud_properties": map[string]any{}},
		}
	}
	fipPort := func() string {
		t.Helper()
		f, err := floatingips.Get(ctx, net, fip.ID).Extract()
		if err != nil {
			t.Fatal(err)
		}
		return f.PortID
	}
	portOf := func(vm string) ports.Port {
		t.Helper()
		list := a.ports(t, "device_id="+vm)
		if len(list) != 1 {
			t.Fatalf("server %s has %d ports", vm, len(list))
		}
		p, err := ports.Get(ctx, net, list[0].ID).Extract()
		if err != nil {
			t.Fatal(err)
		}
		return *p
	}

	// 1. A vip network, the VRRP pair, a server group, two zones of which
	// one does not exist: the VM lands in the other.
	props := map[string]any{"instance_type": "runway.tiny", "allowed_address_pairs": "10.20.0.240",
		"scheduler_hints": map[string]any{"group": group.ID}, "availability_zones": []string{"nowhere", "nova"},
		"loadbalancer_pools": []map[string]any{{"name": poolName, "port": 8080, "monitoring_port": 9090}}}
	vm1 := cpibin.VMCID(t, cpi.OK(t, nil, "create_vm", createVMArgs("parity-1", sc, props, nets("10.20.0.131"), nil)...))
	p1 := portOf(vm1)
	if got := fipPort(); got != p1.ID {
		t.Errorf("floating IP %s is on port %q; want the VM's port %s", fip.FloatingIP, got, p1.ID)
	}
	if len(p1.AllowedAddressPairs) != 1 || p1.AllowedAddressPairs[0].IPAddress != "10.20.0.240" {
		t.Errorf("allowed address pairs = %+v", p1.AllowedAddressPairs)
	}
	g, err := servergroups.Get(ctx, compute, group.ID).Extract()
	if err != nil || !slices.Contains(g.Members, vm1) {
		t.Errorf("server group members = %v (%v); want %s", g.Members, err, vm1)
	}
	srv, err := a.get(t, "compute", "servers/"+vm1)
	if err != nil {
		t.Fatal(err)
	}
	if z := srv["server"].(map[string]any)["OS-EXT-AZ:availability_zone"]; z != "nova" {
		t.Errorf("zone = %v; want nova, the one of availability_zones that exists", z)
	}
	members := poolMembers(t, user, pool)
	if len(members) != 1 || members[0].Address != "10.20.0.131" || members[0].ProtocolPort != 8080 || members[0].MonitorPort != 9090 {
		t.Errorf("pool members = %+v; want 10.20.0.131:8080 (monitor 9090)", members)
	}
	// set_vm_metadata cannot drop the record delete_vm needs.
	cpi.OK(t, nil, "set_vm_metadata", vm1, map[string]string{"lbaas_pool_1": "x/y", "job": "web"})
	// runway.tiny has no ephemeral disk: the agent is told so.
	if disks, _ := userData(t, a, vm1)["disks"].(map[string]any); disks == nil || disks["ephemeral"] != nil {
		t.Errorf("agent disks = %v; want ephemeral null", disks)
	}

	// 2. The same floating IP for a second VM moves it there (the
	// official CPI's reassociation); with a flavor that has an ephemeral
	// disk the agent is told /dev/sdb.
	vm2 := cpibin.VMCID(t, cpi.OK(t, nil, "create_vm", createVMArgs("parity-2", sc,
		map[string]any{"instance_type": "runway.ephemeral"}, nets("10.20.0.132"), nil)...))
	if got, want := fipPort(), portOf(vm2).ID; got != want {
		t.Errorf("floating IP is on port %q; want it moved to the second VM's %s", got, want)
	}
	if disks, _ := userData(t, a, vm2)["disks"].(map[string]any); disks == nil || disks["ephemeral"] != "/dev/sdb" {
		t.Errorf("agent disks = %v; want ephemeral /dev/sdb", disks)
	}
	cpi.OK(t, nil, "delete_vm", vm2)
	if got := fipPort(); got != "" {
		t.Errorf("after delete_vm the floating IP is still on port %s", got)
	}
	cpi.OK(t, nil, "delete_vm", vm1)
	if members := poolMembers(t, user, pool); len(members) != 0 {
		t.Errorf("after delete_vm the pool still has %+v", members)
	}

	// 3. Refusals, each before anything is made, naming what is wrong.
	for _, tc := range []struct {
		props map[string]any
		nets  map[string]any
		ctx   map[string]any
		disks []string
		want  string
	}{
		{props: map[string]any{"instance_type": "runway.tiny", "allowed_address_pairs": "10.20.0.241"}, nets: nets("10.20.0.133"),
			want: "no port holds 10.20.0.241"},
		{props: map[string]any{"instance_type": "runway.tiny", "availability_zones": []string{"nowhere"}}, nets: nets("10.20.0.133"),
			want: "availability zone"},
		{props: map[string]any{"instance_type": "runway.tiny", "loadbalancer_pools": []map[string]any{{"name": "no-such-pool", "port": 80}}},
			nets: nets("10.20.0.133"), want: `0 pools are named "no-such-pool"`},
		// TEST-NET-1: never a floating IP of the dev cloud.
		{props: map[string]any{"instance_type": "runway.tiny"}, nets: map[string]any{"public": map[string]any{"type": "vip", "ip": "192.0.2.10"},
			"private": nets("10.20.0.133")["private"]}, want: "192.0.2.10 is not allocated"},
		{props: map[string]any{"instance_type": "runway.tiny", "availability_zones": []string{"nova", "b"}},
			ctx: map[string]any{"ignore_server_availability_zone": false}, want: "ignore_server_availability_zone"},
	} {
		r := cpi.Call(t, tc.ctx, "create_vm", createVMArgs("parity-x", sc, tc.props, tc.nets, tc.disks)...)
		if r.Error == nil || !strings.Contains(r.Error.Message, tc.want) {
			t.Errorf("create_vm %v: %+v; want an error saying %q", tc.props, r.Error, tc.want)
		}
		if r.Error == nil {
			cpi.OK(t, nil, "delete_vm", cpibin.VMCID(t, r.Result))
		}
	}

	// 4. vrrp_port_check: false takes a pair no port holds; a disk keeps
	// the VM in its zone unless ignore_server_availability_zone.
	var disk string
	json.Unmarshal(cpi.OK(t, nil, "create_disk", 1024, map[string]any{}, nil), &disk)
	r := cpi.Call(t, map[string]any{"ignore_server_availability_zone": false}, "create_vm",
		createVMArgs("parity-z", sc, map[string]any{"instance_type": "runway.tiny", "availability_zone": "elsewhere"}, map[string]any{}, []string{disk})...)
	if r.Error == nil || !strings.Contains(r.Error.Message, `disk `+disk+` is in zone "nova"`) {
		t.Errorf("a VM asked for another zone than its disk: %+v", r.Error)
	}
	noCheck := nets("10.20.0.134")
	delete(noCheck, "public")
	noCheck["private"].(map[string]any)["cloud_properties"] = map[string]any{"net_id": c.netID, "vrrp_port_check": false}
	// The job's config_drive (cdrom) and use_dhcp (false), from a
	// cpi-config context, as the official CPI applies them.
	jobProps := map[string]any{"ignore_server_availability_zone": false, "config_drive": "cdrom", "use_dhcp": false}
	vm3 := cpibin.VMCID(t, cpi.OK(t, jobProps, "create_vm", createVMArgs("parity-3", sc,
		map[string]any{"instance_type": "runway.tiny", "allowed_address_pairs": "10.20.0.241"}, noCheck, []string{disk})...))
	if p := portOf(vm3); len(p.AllowedAddressPairs) != 1 || p.AllowedAddressPairs[0].IPAddress != "10.20.0.241" {
		t.Errorf("allowed address pairs without the check = %+v", p.AllowedAddressPairs)
	}
	srv, err = a.get(t, "compute", "servers/"+vm3)
	if err != nil {
		t.Fatal(err)
	}
	if cd := srv["server"].(map[string]any)["config_drive"]; cd != "True" {
		t.Errorf("config_drive = %v; want True", cd)
	}
	if n, _ := userData(t, a, vm3)["networks"].(map[string]any); n == nil || n["private"].(map[string]any)["use_dhcp"] != false {
		t.Errorf("agent networks = %v; want use_dhcp false", n)
	}
	cpi.OK(t, nil, "delete_vm", vm3)
	cpi.OK(t, nil, "delete_disk", disk)
	cpi.OK(t, nil, "delete_stemcell", sc)

	// 5. A heavy stemcell's image properties reach Glance as the official
	// CPI writes them.
	img, _ := rawImage(t)
	var heavy string
	json.Unmarshal(cpi.OK(t, nil, "create_stemcell", img, map[string]any{"name": "bosh-openstack-kvm-ubuntu-jammy-go_agent",
		"version": "1.181", "disk_format": "raw", "container_format": "bare", "hypervisor": "qemu", "os_type": "linux",
		"os_distro": "ubuntu", "architecture": "x86_64", "auto_disk_config": true, "hw_disk_bus": "scsi",
		"hw_scsi_model": "virtio-scsi", "tags": map[string]string{"team": "parity"}}), &heavy)
	got, err := a.get(t, "image", "v2/images/"+heavy)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{"name": "bosh-openstack-kvm-ubuntu-jammy-go_agent/1.181", "hypervisor_type": "qemu",
		"os_type": "linux", "os_distro": "ubuntu", "architecture": "x86_64", "auto_disk_config": "true", "hw_disk_bus": "scsi",
		"hw_scsi_model": "virtio-scsi", "version": "1.181", "visibility": "private"} {
		if got[k] != v {
			t.Errorf("image %s: %s = %v; want %v", heavy, k, got[k], v)
		}
	}
	if tags, _ := got["tags"].([]any); !slices.Contains(tags, any("team=parity")) {
		t.Errorf("image tags = %v; want team=parity", got["tags"])
	}
	cpi.OK(t, nil, "delete_stemcell", heavy)
}
