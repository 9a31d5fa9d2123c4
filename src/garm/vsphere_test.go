package garm_test

import (
	"context"
	"encoding/base64"
	"strings"
	"testing"

	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/session"
	"github.com/vmware/govmomi/vim25"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"

	"github.com/runway-cpi/runway/src/testkit/cpibin"
	"github.com/runway-cpi/runway/src/testkit/vcsim"
)

// garm's instances as VMs on vCenter (govmomi's simulator), through the
// same bin/cpi: the pool's image maps to an OVF stemcell, the instance is
// a linked clone whose guestinfo carries garm's runner install for
// cloud-init, found by id or name, gone after DeleteInstance.
func TestInstancesAreVSphereVMs(t *testing.T) {
	sim := vcsim.Start(t)
	bin, err := cpibin.Path("vsphere")
	if err != nil {
		t.Fatal(err)
	}
	section := sim.Section(map[string]any{"datacenters": []any{map[string]any{"name": "DC0", "datastore_pattern": `\ALocalDS_0\z`,
		"persistent_datastore_pattern": `\ALocalDS_`, "clusters": []any{"DC0_C0"}}}})
	g := newCloudGarm(t, "vsphere", bin, section, "ctl-vsphere", vcsim.StemcellImage(t), map[string]any{}, map[string]any{
		"flavors":  map[string]any{"small": map[string]any{"cpu": 1, "ram": 512, "disk": 1024}},
		"networks": map[string]any{"runners": map[string]any{"type": "dynamic", "cloud_properties": map[string]any{"name": "VM Network"}}}})

	inst := decode[rawInstance](t, g.ok("CreateInstance", "pool-v", "", bootstrap("runner-vm", "pool-v", "")))
	if inst.Status != "running" || !strings.HasPrefix(inst.ProviderID, "vm-") {
		t.Fatalf("created %+v; want a running vm-<uuid>", inst)
	}
	vm := vsphereVM(t, sim, inst.ProviderID)
	ud := ""
	for _, o := range vm.Config.ExtraConfig {
		if ov := o.GetOptionValue(); ov.Key == "guestinfo.userdata" {
			b, _ := base64.StdEncoding.DecodeString(ov.Value.(string))
			ud = string(b)
		}
	}
	if !strings.HasPrefix(ud, "#cloud-config") || !strings.Contains(ud, "runcmd") {
		t.Errorf("guestinfo.userdata %q; want garm's runner install for cloud-init", ud[:min(80, len(ud))])
	}
	for _, id := range []string{inst.ProviderID, "runner-vm"} {
		if got := decode[rawInstance](t, g.ok("GetInstance", "pool-v", id, nil)); got.ProviderID != inst.ProviderID {
			t.Errorf("GetInstance(%s) = %+v", id, got)
		}
	}
	if list := decode[[]rawInstance](t, g.ok("ListInstances", "pool-v", "", nil)); len(list) != 1 {
		t.Errorf("ListInstances = %+v; want one", list)
	}
	g.ok("StopInstance", "pool-v", "runner-vm", nil)
	if got := decode[rawInstance](t, g.ok("GetInstance", "pool-v", "runner-vm", nil)); got.Status != "stopped" {
		t.Errorf("after StopInstance: %+v", got)
	}
	g.ok("DeleteInstance", "pool-v", "runner-vm", nil)
	if r := g.run("GetInstance", "pool-v", inst.ProviderID, nil); r.code != 30 {
		t.Errorf("instance survived DeleteInstance: exit %d", r.code)
	}
}

// vsphereVM reads a VM by name, logged in as the test.
func vsphereVM(t *testing.T, sim *vcsim.Sim, name string) mo.VirtualMachine {
	t.Helper()
	ctx := context.Background()
	u := *sim.Server.URL
	sc := soap.NewClient(&u, true)
	c, err := vim25.NewClient(ctx, sc)
	if err != nil {
		t.Fatal(err)
	}
	if err := session.NewManager(c).Login(ctx, u.User); err != nil {
		t.Fatal(err)
	}
	ref, err := find.NewFinder(c, false).VirtualMachine(ctx, "/DC0/vm/BOSH_VMs/"+name)
	if err != nil {
		t.Fatal(err)
	}
	var vm mo.VirtualMachine
	if err := ref.Properties(ctx, ref.Reference(), []string{"config"}, &vm); err != nil {
		t.Fatal(err)
	}
	return vm
}
