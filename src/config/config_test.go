package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/driver"
)

func TestSmallestConfigGetsDefaults(t *testing.T) {
	c, err := Parse([]byte(`{"driver": "local", "state_dir": "/some/dir"}`), "cpi.json")
	if err != nil {
		t.Fatal(err)
	}
	if c.LogLevel != "info" || c.LockTimeoutSeconds != DefaultLockTimeout || c.Retry.WaitBudgetSeconds != DefaultWaitBudgetSeconds ||
		c.Retry.MaxBackoffSeconds != DefaultMaxBackoffSeconds || c.Retry.InitialBackoffMilli != DefaultInitialBackoffMs {
		t.Fatalf("defaults not applied: %+v", c)
	}
	if string(c.DriverSection()) != "{}" {
		t.Fatalf("absent section = %s", c.DriverSection())
	}
}

func TestErrorsNameTheField(t *testing.T) {
	for doc, want := range map[string]string{
		`{"state_dir": "/x"}`:                                                           "driver: is required",
		`{"driver": "vsphere", "state_dir": "/x"}`:                                      `driver: unknown driver "vsphere"`,
		`{"driver": "local"}`:                                                           "state_dir: is required",
		`{"driver": "local", "state_dir": "rel/dir"}`:                                   "state_dir: must be an absolute path",
		`{"driver": "local", "state_dir": "/x", "log_level": "loud"}`:                   "log_level:",
		`{"driver": "local", "state_dir": "/x", "stat_dir": "/y"}`:                      `unknown field "stat_dir"`,
		`{"driver": "local", "state_dir": 5}`:                                           "state_dir: must be a string, got number",
		`{"driver": "local", "state_dir": "/x", "retry": {"wait_budget_seconds": "a"}}`: "retry.wait_budget_seconds: must be a number",
		`{"driver": "local", "state_dir": "/x", "retry": {"wait_budget_seconds": -1}}`:  "retry.wait_budget_seconds: must be positive",
		`{"driver": "local",`:                                                           "invalid JSON",
		`[]`:                                                                            "must be a JSON object",
	} {
		_, err := Parse([]byte(doc), "cpi.json")
		if err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "config cpi.json: ") {
			t.Errorf("%s: got %v; want %q", doc, err, want)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.json"))
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("got %v", err)
	}
}

func TestContextOverridesDriverSection(t *testing.T) {
	c, err := Parse([]byte(`{"driver": "local", "state_dir": "/x", "local": {"stop_grace_seconds": 5, "nested": {"a": 1, "b": 2}}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	merged, used, err := c.MergeContext(map[string]any{"director_uuid": "d", "local": map[string]any{"stop_grace_seconds": 9.0, "nested": map[string]any{"b": 3.0}}})
	if err != nil || !reflect.DeepEqual(used, []string{"local"}) {
		t.Fatal(used, err)
	}
	var got map[string]any
	json.Unmarshal(merged, &got)
	if got["stop_grace_seconds"] != 9.0 || got["nested"].(map[string]any)["a"] != 1.0 || got["nested"].(map[string]any)["b"] != 3.0 {
		t.Fatalf("merged = %s", merged)
	}
}

func TestEmbeddedUsesStateDirEnv(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("RUNWAY_STATE_DIR", dir)
	c, err := Embedded()
	if err != nil || c.Driver != "local" || c.StateDir != dir {
		t.Fatalf("embedded = %+v, %v", c, err)
	}
	os.Unsetenv("RUNWAY_STATE_DIR")
	t.Setenv("HOME", "/home/u")
	if DefaultStateDir() != "/home/u/.runway/state" {
		t.Fatalf("default = %s", DefaultStateDir())
	}
}

func init() {
	// An official name the way a driver registers one (the drivers'
	// packages are not linked into this test).
	driver.RegisterAliases("openstack", driver.Rename("api_key", "password"))
}

func TestFlatContextKeysWinOverTheSectionAsTheDirectorSendsThem(t *testing.T) {
	c, err := Parse([]byte(`{"driver": "openstack", "state_dir": "/x", "openstack": {"auth_url": "http://a/v3", "api_key": "file-pw", "region": "one", "connection_options": {"ca_cert": "x"}}}`), "")
	if err != nil {
		t.Fatal(err)
	}
	// The Director's own keys stay out; password (Runway's name) replaces
	// api_key (the official name) from the file; a map replaces a map.
	merged, used, err := c.MergeContext(map[string]any{"director_uuid": "d", "request_id": "cpi-1", "vm": map[string]any{"stemcell": map[string]any{"api_version": 2.0}},
		"password": "ctx-pw", "region": "two", "connection_options": map[string]any{"ssl_verify_peer": false}})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	json.Unmarshal(merged, &got)
	want := map[string]any{"auth_url": "http://a/v3", "password": "ctx-pw", "region": "two", "connection_options": map[string]any{"ssl_verify_peer": false}}
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(used, []string{"connection_options", "password", "region"}) {
		t.Fatalf("merged = %s, used %v", merged, used)
	}
	// Nothing but the Director's keys: the section as it is, no work.
	same, used, err := c.MergeContext(map[string]any{"director_uuid": "d", "request_id": "cpi-1"})
	if err != nil || string(same) != string(c.DriverSection()) || used != nil {
		t.Fatalf("untouched = %s %v %v", same, used, err)
	}
	// Both names of one setting in the context: which was meant?
	if _, _, err := c.MergeContext(map[string]any{"director_uuid": "d", "api_key": "a", "password": "b"}); err == nil ||
		!strings.Contains(err.Error(), "api_key and password name the same setting") {
		t.Fatalf("err = %v", err)
	}
}

func TestOfficialConfigShape(t *testing.T) {
	t.Setenv("RUNWAY_STATE_DIR", "/var/tmp/rw")
	c, err := Parse([]byte(`{"cloud": {"plugin": "openstack", "properties": {
		"openstack": {"auth_url": "http://k/v3", "api_key": "pw"},
		"agent": {"ntp": ["0.pool.ntp.org"], "mbus": "nats://n:4222"},
		"registry": {"endpoint": "http://r:25777", "user": "u", "password": "p"}}}}`), "cpi.json")
	if err != nil {
		t.Fatal(err)
	}
	if c.Driver != "openstack" || c.StateDir != "/var/tmp/rw" || c.Agent.Mbus != "nats://n:4222" || len(c.Agent.NTP) != 1 ||
		!strings.Contains(string(c.DriverSection()), `"api_key"`) {
		t.Fatalf("config = %+v section %s", c, c.DriverSection())
	}
	for doc, want := range map[string]string{
		`{"cloud": {"plugin": "vsphere", "properties": {}}}`:                   `unknown plugin "vsphere"`,
		`{"cloud": {"plugin": "aws", "properties": {"aws": {}, "agnet": {}}}}`: `unknown key "agnet" (did you mean "agent"?)`,
		`{"cloud": {"plugin": "aws", "properties": {}}, "driver": "aws"}`:      "takes no other top-level key",
		`{"cloud": {"plugin": "aws", "properties": {"agent": {"ntp": "x"}}}}`:  "cloud.properties.agent: ntp: must be an array",
		`{"cloud": {"plugin": "aws", "propertise": {}}}`:                       `unknown field "propertise"`,
	} {
		if _, err := Parse([]byte(doc), "cpi.json"); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err = %v, want %q", doc, err, want)
		}
	}
	// stemcell (aws: kernel_id) goes into the driver's section, where the
	// driver refuses or takes it.
	c, err = Parse([]byte(`{"cloud": {"plugin": "aws", "properties": {"aws": {"region": "r"}, "stemcell": {"kernel_id": "aki-1"}}}}`), "")
	if err != nil || !strings.Contains(string(c.DriverSection()), `"kernel_id":"aki-1"`) {
		t.Fatalf("section %s, %v", c.DriverSection(), err)
	}
}
