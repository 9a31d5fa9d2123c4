package config

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
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
		`{"driver": "vcloud", "state_dir": "/x"}`:                                       `driver: unknown driver "vcloud"`,
		`{"driver": "local"}`:                                                           "state_dir: is required",
		`{"driver": "local", "state_dir": "rel/dir"}`:                                   "state_dir: must be an absolute path",
		`{"driver": "local", "state_dir": "/x", "log_level": "loud"}`:                   "log_level:",
		`{"driver": "local", "state_dir": "/x", "stat_dir": "/y"}`:                      `unknown key "stat_dir" (did you mean "state_dir"?)`,
		`{"driver": "local", "state_dir": 5}`:                                           "state_dir: must be a string, got the number 5",
		`{"driver": "local", "state_dir": "/x", "retry": {"wait_budget_seconds": "a"}}`: `retry.wait_budget_seconds: must be an integer, got a string "a"`,
		`{"driver": "local", "state_dir": "/x", "retry": {"wait_budget_seconds": -1}}`:  "retry.wait_budget_seconds: -1: must be 1 to 86400",
		`{"driver": "local", "state_dir": "/x", "lock_timeout_seconds": 9223372037}`:    "lock_timeout_seconds: 9223372037: must be 1 to 86400",
		`{"driver": "local", "state_dir": "/x", "retry": {"initial_backoff_ms": 1e12}}`: "retry.initial_backoff_ms",
		`null`:                "must be a JSON object, got null",
		`{"driver": "local",`: "invalid JSON",
		`[]`:                  "must be an object, got a list",
	} {
		_, err := Parse([]byte(doc), "cpi.json")
		if err == nil || !strings.Contains(err.Error(), want) || !strings.HasPrefix(err.Error(), "config cpi.json: ") {
			t.Errorf("%s: got %v; want %q", doc, err, want)
		}
	}
}

// A FIFO (or any file that is not a regular one) is refused at once: an
// open would block until a writer came.
func TestLoadRefusesAFIFO(t *testing.T) {
	p := filepath.Join(t.TempDir(), "cpi.json")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), "is not a regular file") {
		t.Fatalf("got %v", err)
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.json"))
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("got %v", err)
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
		`{"cloud": {"plugin": "vcloud", "properties": {}}}`:                    `unknown plugin "vcloud"`,
		`{"cloud": {"plugin": "aws", "properties": {"aws": {}, "agnet": {}}}}`: `unknown key "agnet" (did you mean "agent"?)`,
		`{"cloud": {"plugin": "aws", "properties": {}}, "driver": "aws"}`:      "takes no other top-level key",
		`{"cloud": {"plugin": "aws", "properties": {"agent": {"ntp": "x"}}}}`:  `cloud.properties.agent.ntp: must be a list, got a string "x"`,
		`{"cloud": {"plugin": "aws", "propertise": {}}}`:                       `cloud: unknown key "propertise" (did you mean "properties"?)`,
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
	// The vSphere CPI's job renders its vCenter list and plugins beside
	// agent, not under its name: they go into the section.
	c, err = Parse([]byte(`{"cloud": {"plugin": "vsphere", "properties": {"vcenters": [{"host": "vc"}], "agent": {"ntp": ["n"]}, "plugins": {}}}}`), "")
	if err != nil || c.Driver != "vsphere" || string(c.DriverSection()) != `{"plugins":{},"vcenters":[{"host":"vc"}]}` || len(c.Agent.NTP) != 1 {
		t.Fatalf("vsphere: section %s, agent %+v, %v", c.DriverSection(), c.Agent, err)
	}
	if _, err := Parse([]byte(`{"cloud": {"plugin": "vsphere", "properties": {"vcenter": []}}}`), ""); err == nil || !strings.Contains(err.Error(), `did you mean "vcenters"`) {
		t.Errorf("vsphere with a typo: %v", err)
	}
}
