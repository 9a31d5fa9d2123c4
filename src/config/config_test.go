package config

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
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
	merged, err := c.MergeContext(map[string]any{"director_uuid": "d", "local": map[string]any{"stop_grace_seconds": 9.0, "nested": map[string]any{"b": 3.0}}})
	if err != nil {
		t.Fatal(err)
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
