package openstack

import (
	"bytes"
	"context"
	"testing"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/keypairs"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"

	"github.com/runway-cpi/runway/src/testkit/cpibin"
	"github.com/runway-cpi/runway/src/testkit/realinputs"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// TestRealCallersInputs drives bin/cpi on the dev cloud with what real
// BOSH sends (src/testkit/realinputs, each shape from its caller's
// source): a cpi-config with bosh-deployment's openstack/cpi.yml
// properties in the Director's context, heavy stemcells' stemcell.MF
// cloud_properties (qcow2 and raw) and a light one, the cloud-config's VM
// type and az, the Director's manual (prefix "32", nic_group), dynamic and
// vip network settings and its create_vm env, bosh-cli's create-env
// network. Every call must succeed.
func TestRealCallersInputs(t *testing.T) {
	c := devCloud(t)
	env := testenv.Need(t, "fixtures.env of scripts/openstack-dev", "RUNWAY_OS_EXT_NET_ID", "RUNWAY_OS_IMAGE_ID")
	director := "real-" + uuid.NewString()[:8]
	t.Cleanup(func() { assertNoneTagged(t, c, "director", director) })
	user, _ := newTestDriver(t, c, "", "", nil)
	ctx := context.Background()
	compute, err := user.client(ctx, "compute")
	if err != nil {
		t.Fatal(err)
	}
	key := "bosh-" + director
	if _, err := keypairs.Create(ctx, compute, keypairs.CreateOpts{Name: key}).Extract(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { keypairs.Delete(context.Background(), compute, key, nil) })
	net, err := user.client(ctx, "network")
	if err != nil {
		t.Fatal(err)
	}
	fip, err := floatingips.Create(ctx, net, floatingips.CreateOpts{FloatingNetworkID: env[0]}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { floatingips.Delete(context.Background(), net, fip.ID) })

	// The file holds a stand-in account, as bosh-deployment's
	// openstack/cpi-secondary.yml does ("unused values should be
	// overwritten via Director's cpi config"); the real one comes in the
	// context, with the official job's names.
	cpi := officialCaller(t, c, director, map[string]any{"username": "unused", "api_key": "unused", "domain": "Default"})
	cpi.Context = realinputs.DirectorContext(director, 3, realinputs.OpenStackCPIConfig(c.authURL, c.user, c.password, c.project, c.region))
	cpi.Context["default_key_name"] = key

	var stemcells []string
	for _, format := range []string{"qcow2", "raw"} {
		img := realinputs.StemcellImage(t, bytes.Repeat([]byte{0}, 1<<20))
		stemcells = append(stemcells, cpibin.String(t, cpi.OK(t, nil, "create_stemcell", img, realinputs.HeavyStemcell("openstack", format),
			map[string]any{"tags": map[string]string{"team": "real-inputs"}})))
	}
	stemcells = append(stemcells, cpibin.String(t, cpi.OK(t, nil, "create_stemcell", "", map[string]any{"image_id": env[1]})))

	sub := map[string]any{"net_id": c.netID}
	for i, sc := range stemcells {
		for name, nets := range map[string]map[string]any{
			"manual+vip": {"default": realinputs.ManualNetwork("10.20.0.21", "255.255.255.0", "10.20.0.1", sub, "1"),
				"public": realinputs.VIPNetwork(fip.FloatingIP, map[string]any{})},
			"dynamic":    {"default": realinputs.DynamicNetwork(sub)},
			"create-env": {"default": realinputs.BootstrapNetwork("10.20.0.22", "255.255.255.0", "10.20.0.1", sub)},
		} {
			vmEnv := realinputs.DirectorEnv("agent-1")
			if name == "create-env" {
				vmEnv = realinputs.BootstrapEnv()
			}
			vm := cpibin.VMCID(t, cpi.OK(t, nil, "create_vm", "agent-1", sc, realinputs.OpenStackVMType("runway.tiny", "nova"), nets, []string{}, vmEnv))
			cpi.OK(t, nil, "set_vm_metadata", vm, map[string]string{"director": director, "deployment": "cf",
				"instance_group": "router", "job": "router", "id": "9c3b5b0a", "name": "router/9c3b5b0a", "index": "0",
				"created_at": "2026-11-24T22:31:16Z"})
			if i == 0 {
				disk := cpibin.String(t, cpi.OK(t, nil, "create_disk", 3000, map[string]any{}, vm))
				cpi.OK(t, nil, "attach_disk", vm, disk)
				cpi.OK(t, nil, "detach_disk", vm, disk)
				cpi.OK(t, nil, "delete_disk", disk)
			}
			cpi.OK(t, nil, "delete_vm", vm)
		}
	}
	for _, sc := range stemcells {
		cpi.OK(t, nil, "delete_stemcell", sc)
	}
}
