package e2e

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/session"
	"github.com/vmware/govmomi/vim25"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/testkit/cpibin"
	"github.com/runway-cpi/runway/src/testkit/vcsim"
)

// The orchestrator unchanged, its CPI the vsphere driver on govmomi's
// vCenter simulator: a queued job makes a runner VM (the OVF stemcell
// uploaded once, a linked clone whose guestinfo carries the runner's
// bootstrap for cloud-init). vcsim runs no guest, so the runner never
// registers: past the spawn timeout the orchestrator deletes the VM, and
// the next pass makes another — both paths on vSphere.
func TestRunnersAsVSphereVMs(t *testing.T) {
	sim := vcsim.Start(t)
	e := newEnv(t)
	cpi, err := cpibin.Path("vsphere")
	must(t, err)
	e.cpiPath = cpi
	section := sim.Section(map[string]any{"datacenters": []any{map[string]any{"name": "DC0", "datastore_pattern": `\ALocalDS_0\z`,
		"persistent_datastore_pattern": `\ALocalDS_`, "clusters": []any{"DC0_C0"}}}})
	b, _ := json.Marshal(map[string]any{"driver": "vsphere", "state_dir": filepath.Join(e.dir, "cpi-state"), "vsphere": section})
	must(t, os.WriteFile(e.cpiCfg, b, 0o600))
	group := fmt.Sprintf(`
  - name: linux
    scope: org
    org: acme
    labels: ["linux"]
    max_active_runners: 1
    stemcell: {image: %q}
    cloud_properties: {cpu: 1, ram: 512, disk: 1024}
    networks: {runners: {type: dynamic, cloud_properties: {name: "VM Network"}}}
    runner:
      command: /usr/local/bin/act_runner
    timeouts: {spawn: 3s, idle: 2m, max_lifetime: 10m}
`, vcsim.StemcellImage(t))
	e.writeConfig("300ms", group)
	e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	e.start()
	var first string
	e.eventually(60*time.Second, "a runner VM on vCenter", func() bool {
		if vms := e.vms(); len(vms) == 1 && strings.HasPrefix(vms[0].CID, "vm-") {
			first = vms[0].CID
			return true
		}
		return false
	})
	// The bootstrap itself, not the agent settings that carry it in env.
	if ud := guestUserData(t, sim, first); !strings.Contains(ud, "act_runner") || json.Valid([]byte(ud)) {
		t.Errorf("the runner VM's guestinfo.userdata does not start the runner: %q", ud[:min(200, len(ud))])
	}
	e.eventually(60*time.Second, "the runner that never registered deleted, another made", func() bool {
		vms := e.vms()
		return len(vms) == 1 && vms[0].CID != first
	})
}

// guestUserData reads a VM's guestinfo.userdata, logged in as the test.
func guestUserData(t *testing.T, sim *vcsim.Sim, name string) string {
	t.Helper()
	ctx := context.Background()
	u := *sim.Server.URL
	c, err := vim25.NewClient(ctx, soap.NewClient(&u, true))
	must(t, err)
	must(t, session.NewManager(c).Login(ctx, u.User))
	ref, err := find.NewFinder(c, false).VirtualMachine(ctx, "/DC0/vm/BOSH_VMs/"+name)
	must(t, err)
	var vm mo.VirtualMachine
	must(t, ref.Properties(ctx, ref.Reference(), []string{"config.extraConfig"}, &vm))
	for _, o := range vm.Config.ExtraConfig {
		if ov := o.GetOptionValue(); ov.Key == "guestinfo.userdata" {
			b, _ := base64.StdEncoding.DecodeString(ov.Value.(string))
			return string(b)
		}
	}
	return ""
}
