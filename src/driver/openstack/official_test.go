package openstack

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/rpc"
	"github.com/runway-cpi/runway/src/testkit/cpibin"
)

// The official OpenStack CPI's cloud properties, written from its
// documentation (bosh.io/docs/openstack-cpi), each with a value an
// operator would write. Every key must be honoured or refused by name.
var officialVMProps = map[string]any{
	"instance_type":         "m1.small",
	"availability_zone":     "z1",
	"availability_zones":    []string{"z1"},
	"key_name":              "bosh",
	"security_groups":       []string{"default"},
	"boot_from_volume":      true,
	"root_disk":             map[string]any{"size": 20},
	"ephemeral_disk":        map[string]any{"size": 10240},
	"scheduler_hints":       map[string]any{"group": "6a4cb3e0-1f2d-4e8b-9c6f-0a1b2c3d4e5f"},
	"allowed_address_pairs": "10.0.0.10",
	"vrrp_port_check":       false,
	"loadbalancer_pools":    []map[string]any{{"name": "web", "port": 80}},
}

// refusedVMProps are the official keys the driver refuses, and why.
var refusedVMProps = map[string]string{
	"ephemeral_disk": "ephemeral_disk is not supported",
}

var officialNetworkProps = map[string]any{
	"net_id":          "0c2f4c1e-8d8b-4c55-bb55-3d0e2a7e6b10",
	"security_groups": []string{"default"},
	"vrrp_port_check": false,
}

var officialDiskProps = map[string]any{"type": "SSD"}

// TestEveryOfficialCloudPropertyIsHonouredOrRefusedByName runs bin/cpi
// against a closed endpoint: a key that passes the driver's checks goes on
// to the cloud and fails there (the endpoint named); a refused key fails
// before, naming itself; a misspelt key names the closest known one.
func TestEveryOfficialCloudPropertyIsHonouredOrRefusedByName(t *testing.T) {
	dir := t.TempDir()
	cpi := cpibin.Configured(t, dir, "openstack", map[string]any{"cloud": map[string]any{"plugin": "openstack", "properties": map[string]any{
		"openstack": map[string]any{"auth_url": "http://127.0.0.1:9/v3", "username": "u", "api_key": "secret-pw", "project": "p",
			"domain": "Default", "ignore_server_availability_zone": true, "state_timeout": 5}}}})
	t.Setenv("RUNWAY_STATE_DIR", filepath.Join(dir, "state"))
	cpi.Secrets = []string{"secret-pw"}
	const reachedTheCloud = "127.0.0.1:9"
	stemcell := "6a4cb3e0-1f2d-4e8b-9c6f-0a1b2c3d4e50"
	nets := func(props map[string]any) map[string]any {
		return map[string]any{"private": map[string]any{"type": "manual", "ip": "10.0.0.5", "cloud_properties": props}}
	}
	for key, v := range officialVMProps {
		props := map[string]any{"instance_type": "m1.small", key: v}
		if key == "availability_zones" {
			delete(props, "availability_zone")
		}
		r := cpi.Call(t, nil, "create_vm", "agent", stemcell, props, nets(map[string]any{"net_id": "n"}), []string{}, map[string]any{})
		cpibin.HonouredOrRefused(t, "vm", key, r, refusedVMProps[key], reachedTheCloud)
	}
	for key, v := range officialNetworkProps {
		props := map[string]any{"net_id": "n", key: v}
		r := cpi.Call(t, nil, "create_vm", "agent", stemcell, map[string]any{"instance_type": "m1.small"}, nets(props), []string{}, map[string]any{})
		cpibin.HonouredOrRefused(t, "network", key, r, "", reachedTheCloud)
	}
	for key, v := range officialDiskProps {
		cpibin.HonouredOrRefused(t, "disk", key, cpi.Call(t, nil, "create_disk", 1024, map[string]any{key: v}, nil), "", reachedTheCloud)
	}
	// A key no driver knows: named, with the closest known key.
	for what, call := range map[string]func() rpc.Reply{
		`"instance_typ"`: func() rpc.Reply {
			return cpi.Call(t, nil, "create_vm", "agent", stemcell, map[string]any{"instance_typ": "m"}, nets(map[string]any{"net_id": "n"}), []string{}, map[string]any{})
		},
		`"netid"`: func() rpc.Reply {
			return cpi.Call(t, nil, "create_vm", "agent", stemcell, map[string]any{"instance_type": "m"}, nets(map[string]any{"netid": "n"}), []string{}, map[string]any{})
		},
		`"volume_type"`: func() rpc.Reply {
			return cpi.Call(t, nil, "create_disk", 1024, map[string]any{"volume_type": "SSD"}, nil)
		},
		`"hypervisor_typo"`: func() rpc.Reply {
			return cpi.Call(t, nil, "create_stemcell", filepath.Join(dir, "none.tgz"), map[string]any{"hypervisor_typo": "kvm"})
		},
	} {
		r := call()
		if r.Error == nil || !strings.Contains(r.Error.Message, "unknown key "+what) || strings.Contains(r.Error.Message, reachedTheCloud) {
			t.Errorf("misspelt %s: %+v", what, r.Error)
		}
	}
}

// A password in auth_url's user info and a token in an endpoint's query
// string never come back: not in the answer's error, its log, or stderr —
// whether the URL comes from the config file or a request's context.
func TestSecretsInsideURLsNeverComeBack(t *testing.T) {
	dir := t.TempDir()
	const pw, tok = "url-pass-0457", "url-token-0458"
	cpi := cpibin.Configured(t, dir, "openstack", map[string]any{"driver": "openstack", "state_dir": filepath.Join(dir, "state"), "log_level": "debug",
		"openstack": map[string]any{"auth_url": "http://admin:" + pw + "@127.0.0.1:9/v3?token=" + tok, "username": "u",
			"password": "p-not-in-url", "project_name": "p", "wait_timeout_seconds": 5}})
	// Secrets: the caller fails the test if they appear in stdout or stderr.
	cpi.Secrets = []string{pw, tok}
	cpi.Context = map[string]any{"director_uuid": "d", "request_id": "cpi-1"}
	for _, ctx := range []map[string]any{nil, {"auth_url": "http://ctx-user:" + pw + "@127.0.0.1:9/v3?x=" + tok}} {
		r := cpi.Call(t, ctx, "has_vm", "6a4cb3e0-1f2d-4e8b-9c6f-0a1b2c3d4e50")
		if r.Error == nil || !strings.Contains(r.Error.Message, "127.0.0.1:9") {
			t.Fatalf("want an error naming the endpoint: %+v", r.Error)
		}
		if !strings.Contains(r.Error.Message+r.Log, "<redacted>") {
			t.Errorf("the URL's credentials are not shown redacted: %s", r.Error.Message)
		}
	}
}
