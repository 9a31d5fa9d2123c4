package openstack

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/uuid"

	"github.com/runway-cpi/runway/src/testkit/cpibin"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// TestTwoCPIConfigContexts: one config file (project runway, written with
// the official job's key names) and two cpi-config entries as the
// Director sends them — the properties at the context's top level. Every
// VM and disk lands in its context's project, the same context finds and
// deletes it, a context naming a closed endpoint fails on that endpoint,
// and the context's password never comes back.
func TestTwoCPIConfigContexts(t *testing.T) {
	c := devCloud(t)
	b := testenv.Need(t, "fixtures.env of scripts/openstack-dev (the second project)",
		"RUNWAY_OS_B_USER", "RUNWAY_OS_B_PROJECT", "RUNWAY_OS_B_PASSWORD", "RUNWAY_OS_IMAGE_ID")
	const director = "multi-cpi-director"
	t.Cleanup(func() { assertNoneTagged(t, c, "director", director) })
	dir := t.TempDir()
	cpi := cpibin.Configured(t, dir, "openstack", map[string]any{"driver": "openstack", "state_dir": filepath.Join(dir, "state"),
		"openstack": map[string]any{"auth_url": c.authURL, "username": c.user, "api_key": c.password, "project": c.project,
			"region": c.region, "state_timeout": 120, "wait_resource_poll_interval": 1}})
	cpi.Secrets = []string{b[2]}
	cpi.Context = map[string]any{"director_uuid": director, "request_id": "cpi-1", "vm": map[string]any{"stemcell": map[string]any{"api_version": 2}}}
	a := newAdmin(t, c)
	projectID := func(name string) string {
		t.Helper()
		// The admin client's catalog has no identity endpoint: the CLI.
		cmd := exec.Command("openstack", "project", "show", name, "-f", "value", "-c", "id")
		cmd.Env = append(os.Environ(), "OS_USERNAME="+os.Getenv("RUNWAY_OS_ADMIN_USER"), "OS_PROJECT_NAME="+os.Getenv("RUNWAY_OS_ADMIN_PROJECT"),
			"OS_PASSWORD="+os.Getenv("RUNWAY_OS_ADMIN_PASSWORD"), "OS_AUTH_URL="+c.authURL, "OS_USER_DOMAIN_NAME=Default", "OS_PROJECT_DOMAIN_NAME=Default")
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("openstack project show %s: %v", name, err)
		}
		return strings.TrimSpace(string(out))
	}
	// The file's project, and a second cpi-config entry with the official
	// names of another user and project, and its own default volume type.
	entries := map[string]map[string]any{
		c.project: nil,
		b[1]:      {"username": b[0], "api_key": b[2], "project": b[1], "default_volume_type": "runway-alt"},
	}
	agent := "multi-" + uuid.NewString()[:8] + "-"
	for project, props := range entries {
		var sc string
		json.Unmarshal(cpi.OK(t, props, "create_stemcell", "", map[string]any{"image_id": b[3]}), &sc)
		var pair []json.RawMessage
		json.Unmarshal(cpi.OK(t, props, "create_vm", agent+project, sc, map[string]any{"instance_type": "runway.tiny"},
			map[string]any{}, []string{}, map[string]any{}), &pair)
		var vm, disk string
		json.Unmarshal(pair[0], &vm)
		json.Unmarshal(cpi.OK(t, props, "create_disk", 1024, map[string]any{}, nil), &disk)

		srv, err := a.get(t, "compute", "servers/"+vm)
		if err != nil {
			t.Fatal(err)
		}
		if got := srv["server"].(map[string]any)["tenant_id"]; got != projectID(project) {
			t.Errorf("%s: server %s is in project %v; want %s", project, vm, got, projectID(project))
		}
		got, err := a.get(t, "volume", "volumes/"+disk)
		if err != nil {
			t.Fatal(err)
		}
		found, _ := got["volume"].(map[string]any)
		wantType := "fake"
		if props != nil {
			wantType = "runway-alt"
		}
		if found == nil || found["os-vol-tenant-attr:tenant_id"] != projectID(project) || found["volume_type"] != wantType {
			t.Errorf("%s: disk %s = %v; want it in %s with type %s", project, disk, found, projectID(project), wantType)
		}
		// The same context finds it; the other project does not.
		other := entries[c.project]
		if props == nil {
			other = entries[b[1]]
		}
		cpi.ContextKeepsItsOwn(t, props, other, agent+project, vm, disk, sc)
	}

	// Proof the context is used: a closed endpoint fails, naming it.
	r := cpi.Call(t, map[string]any{"auth_url": "http://127.0.0.1:9/v3"}, "has_vm", "00000000-0000-4000-8000-000000000009")
	if r.Error == nil || !strings.Contains(r.Error.Message, "127.0.0.1:9") {
		t.Errorf("a context naming a closed endpoint: %+v", r.Error)
	}
	// A misspelt property is refused, naming it as the context's and the
	// closest key; a key that configures the host is refused by name.
	r = cpi.Call(t, map[string]any{"default_keyname": "k"}, "has_vm", "00000000-0000-4000-8000-000000000009")
	if r.Error == nil || r.Error.Type != "Bosh::Clouds::CpiError" ||
		!strings.Contains(r.Error.Message, `request context: unknown key "default_keyname" (did you mean "default_key_name"?)`) {
		t.Errorf("misspelt context key: %+v", r.Error)
	}
	r = cpi.Call(t, map[string]any{"ca_file": "/etc/shadow"}, "has_vm", "00000000-0000-4000-8000-000000000009")
	if r.Error == nil || !strings.Contains(r.Error.Message, `"ca_file" configures the host and cannot come from a request context`) {
		t.Errorf("host key from the context: %+v", r.Error)
	}
}
