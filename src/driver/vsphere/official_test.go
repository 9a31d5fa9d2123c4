package vsphere

import (
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/testkit/cpibin"
)

// officialCPIJSON is config/cpi.json as the official vsphere_cpi job's
// cpi.json.erb renders it (bosh-vsphere-cpi-release jobs/vsphere_cpi):
// every key it always writes, with the job spec's defaults, and the
// datacenter keys it copies from vcenter.datacenters (with its defaults
// for the folders and allow_mixed_datastores). Stemcells and ephemeral
// disks go to one datastore: bin/cpi names stemcell copies as vCenter
// does (" %2f "), which vcsim cannot store (see TestMain).
func officialCPIJSON(sim *sim, vcenter map[string]any) map[string]any {
	vc := map[string]any{
		"host": sim.host, "user": sim.user, "password": sim.pass,
		"datacenters": []any{map[string]any{
			"name": "DC0", "vm_folder": "BOSH_VMs", "template_folder": "BOSH_Templates", "disk_path": "BOSH_Disks",
			"allow_mixed_datastores": true, "datastore_pattern": `\ALocalDS_0\z`, "persistent_datastore_pattern": `\ALocalDS_`,
			"clusters": []any{"DC0_C0", map[string]any{"DC0_C1": map[string]any{"resource_pool": "DC0_C1_RP1"}}},
		}},
		"default_disk_type": "preallocated", "default_scsi_controller_type": "paravirtual",
		"enable_auto_anti_affinity_drs_rules": false, "cpu_reserve_full_mhz": false,
		"memory_reservation_locked_to_max": false, "upgrade_hw_version": false, "default_hw_version": 17,
		"enable_human_readable_name": false, "http_logging": false, "ensure_no_ip_conflicts": true,
		"connection_options": map[string]any{"ca_cert": sim.caPEM}, "vmx_options": map[string]any{},
	}
	for k, v := range vcenter {
		vc[k] = v
	}
	return map[string]any{"cloud": map[string]any{"plugin": "vsphere", "properties": map[string]any{
		"vcenters": []any{vc},
		"agent":    map[string]any{"ntp": []string{"0.pool.ntp.org", "1.pool.ntp.org"}, "mbus": "nats://nats:pw@10.0.0.6:4222"},
		"plugins":  map[string]any{},
	}}}
}

// configured is bin/cpi with the vSphere driver and doc as its config
// file (the official shape takes its state dir from RUNWAY_STATE_DIR).
func configured(t *testing.T, doc any) cpibin.Caller {
	t.Helper()
	return cpibin.Configured(t, t.TempDir(), "vsphere", doc)
}

// The official job's config, unchanged, drives a whole lifecycle through
// bin/cpi: stemcell, VM (its agent settings carrying the job's agent
// section), metadata, a disk attached and detached, and deletes.
func TestOfficialJobConfigThroughBinCPI(t *testing.T) {
	sim := newSim(t)
	t.Setenv("RUNWAY_STATE_DIR", t.TempDir())
	cpi := configured(t, officialCPIJSON(sim, nil))
	cpi.Secrets = []string{sim.pass}
	cpi.Context = map[string]any{"vm": map[string]any{"stemcell": map[string]any{"api_version": 2}}}
	info := cpi.OK(t, nil, "info")
	if !strings.Contains(string(info), `"vsphere-ovf"`) || !strings.Contains(string(info), `"vsphere-ova"`) {
		t.Errorf("info %s", info)
	}
	sc := cpibin.String(t, cpi.OK(t, nil, "create_stemcell", stemcellImage(t),
		map[string]any{"name": "bosh-vsphere-esxi-ubuntu-jammy-go_agent", "version": "1.1", "infrastructure": "vsphere", "hypervisor": "esxi",
			"disk": 3072, "disk_format": "ovf", "container_format": "bare", "os_type": "linux", "os_distro": "ubuntu", "architecture": "x86_64"}))
	nets := map[string]any{"default": map[string]any{"type": "manual", "ip": "10.0.0.30", "netmask": "255.255.255.0", "gateway": "10.0.0.1",
		"dns": []string{"8.8.8.8"}, "default": []string{"dns", "gateway"}, "cloud_properties": map[string]any{"name": "VM Network"}}}
	env := map[string]any{"bosh": map[string]any{"group": "dir-dep-web", "groups": []string{"dir", "dep", "web"}}}
	vm := cpibin.VMCID(t, cpi.OK(t, nil, "create_vm", "agent-1", sc, map[string]any{"cpu": 1, "ram": 512, "disk": 2048}, nets, []string{}, env))
	if r := cpi.OK(t, nil, "has_vm", vm); string(r) != "true" {
		t.Fatalf("has_vm %s", r)
	}
	d := sim.newDriver(t, nil)
	m := inspect(t, d, vm)
	settings := readEnv(t, d, m)
	if settings["mbus"] != "nats://nats:pw@10.0.0.6:4222" || len(settings["ntp"].([]any)) != 2 || settings["agent_id"] != "agent-1" {
		t.Errorf("agent settings %v: want the job's agent section", settings)
	}
	cpi.OK(t, nil, "set_vm_metadata", vm, map[string]any{"deployment": "dep", "job": "web", "index": "0"})
	disk := cpibin.String(t, cpi.OK(t, nil, "create_disk", 1024, map[string]any{"type": "thin"}, vm))
	hint := cpi.OK(t, nil, "attach_disk", vm, disk)
	if string(hint) != `"1"` && string(hint) != `"2"` {
		t.Errorf("attach_disk hint %s: want the unit number, as the official CPI", hint)
	}
	if r := cpi.OK(t, nil, "get_disks", vm); !strings.Contains(string(r), disk) {
		t.Errorf("get_disks %s", r)
	}
	cpi.OK(t, nil, "detach_disk", vm, disk)
	cpi.OK(t, nil, "delete_vm", vm)
	cpi.OK(t, nil, "delete_disk", disk)
	cpi.OK(t, nil, "delete_stemcell", sc)
	if r := cpi.Call(t, nil, "snapshot_disk", disk, map[string]any{}); r.Error == nil || r.Error.Type != "Bosh::Clouds::NotImplemented" {
		t.Errorf("snapshot_disk: %+v; want NotImplemented, as the official CPI", r.Error)
	}
}

// Every property of the official job (jobs/vsphere_cpi/spec), rendered as
// its template renders it: honoured (a call succeeds on vcsim) or refused
// by name. The job's always-rendered defaults are honoured as they are.
func TestEveryOfficialJobPropertyHasAVerdict(t *testing.T) {
	sim := newSim(t)
	t.Setenv("RUNWAY_STATE_DIR", t.TempDir())
	refused := func(s string) string { return s }
	verdicts := []struct {
		key     string
		value   any
		refusal string // "" honoured
	}{
		{"default_disk_type", "thin", ""},
		{"default_disk_type", "eagerZeroedThick", "default_disk_type"},
		{"default_scsi_controller_type", "lsi_logic_sas", ""},
		{"enable_auto_anti_affinity_drs_rules", true, ""},
		{"cpu_reserve_full_mhz", true, refused("cpu_reserve_full_mhz is not supported")},
		{"memory_reservation_locked_to_max", true, ""},
		{"upgrade_hw_version", true, ""},
		{"default_hw_version", 19, ""},
		{"enable_human_readable_name", true, refused("enable_human_readable_name is not supported")},
		{"http_logging", true, refused("http_logging is not supported")},
		{"ensure_no_ip_conflicts", false, ""},
		{"vmx_options", map[string]any{"disk.enableUUID": 1}, ""},
		{"vm_storage_policy_name", "gold", refused("vm_storage_policy_name is not supported")},
		{"nsx", map[string]any{"address": "nsx", "user": "u", "password": "p"}, refused("nsx is not supported")},
		{"nsxt", map[string]any{"host": "nsxt", "username": "u", "password": "p"}, refused("nsxt is not supported")},
		{"connection_options", map[string]any{"ca_cert": "not a certificate"}, refused("connection_options.ca_cert holds no PEM certificate")},
	}
	for _, v := range verdicts {
		cfg := officialCPIJSON(sim, map[string]any{v.key: v.value})
		cpi := configured(t, cfg)
		cpi.Secrets = []string{sim.pass}
		r := cpi.Call(t, nil, "has_vm", "vm-00000000-0000-4000-8000-000000000000")
		switch {
		case v.refusal == "" && (r.Error != nil || string(r.Result) != "false"):
			t.Errorf("%s=%v: %+v; want it honoured", v.key, v.value, r.Error)
		case v.refusal != "" && (r.Error == nil || !strings.Contains(r.Error.Message, v.refusal)):
			t.Errorf("%s=%v: %+v; want the refusal %q", v.key, v.value, r.Error, v.refusal)
		}
	}
	// plugins: the template always renders {}; a plugin is refused.
	cfg := officialCPIJSON(sim, nil)
	cfg["cloud"].(map[string]any)["properties"].(map[string]any)["plugins"] = map[string]any{"superdeleter": "Enabled"}
	r := configured(t, cfg).Call(t, nil, "has_vm", "vm-00000000-0000-4000-8000-000000000000")
	if r.Error == nil || !strings.Contains(r.Error.Message, "plugins is not supported") {
		t.Errorf("a plugin: %+v", r.Error)
	}
	// Datacenter keys the official schema takes and Runway refuses.
	for key, val := range map[string]any{"datastore_cluster_pattern": "sp", "persistent_datastore_cluster_pattern": "sp", "use_sub_folder": true} {
		cfg := officialCPIJSON(sim, nil)
		dc := cfg["cloud"].(map[string]any)["properties"].(map[string]any)["vcenters"].([]any)[0].(map[string]any)["datacenters"].([]any)[0].(map[string]any)
		dc[key] = val
		r := configured(t, cfg).Call(t, nil, "has_vm", "vm-00000000-0000-4000-8000-000000000000")
		if r.Error == nil || !strings.Contains(r.Error.Message, key+" is not supported") {
			t.Errorf("datacenters[0].%s: %+v", key, r.Error)
		}
	}
}
