// Package release tests the BOSH release: its job templates render (with
// Ruby's ERB, as the Director renders them) into a wrapper that is valid
// sh and a config bin/cpi accepts.
package release

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/orchestrator"
)

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func render(t *testing.T, template string, props map[string]any) string {
	t.Helper()
	ruby, err := exec.LookPath("ruby")
	if err != nil {
		t.Fatal("ruby is required to render job templates (apt-get install ruby; scripts/test installs it)")
	}
	job := filepath.Join(repoRoot(t), "jobs", "runway_cpi")
	pf := filepath.Join(t.TempDir(), "props.json")
	b, _ := json.Marshal(props)
	os.WriteFile(pf, b, 0o600)
	out, err := exec.Command(ruby, "render.rb", filepath.Join(job, "spec"), filepath.Join(job, "templates", template), pf).CombinedOutput()
	if err != nil {
		t.Fatalf("rendering %s: %v\n%s", template, err, out)
	}
	return string(out)
}

func TestConfigTemplateRendersAConfigBinCpiAccepts(t *testing.T) {
	for name, tc := range map[string]struct {
		props map[string]any
		check func(t *testing.T, doc map[string]any)
	}{
		"defaults only": {props: map[string]any{}, check: func(t *testing.T, doc map[string]any) {
			if doc["driver"] != "local" || doc["state_dir"] != "/var/vcap/data/runway_cpi" {
				t.Errorf("defaults: %v", doc)
			}
			if _, ok := doc["openstack"]; ok {
				t.Error("unset driver section rendered")
			}
		}},
		"openstack with agent settings": {props: map[string]any{"runway": map[string]any{
			"driver": "openstack", "log_level": "debug",
			"agent":     map[string]any{"mbus": "nats://10.0.0.6:4222", "ntp": []string{"pool.ntp.org"}, "blobstore": map[string]any{"provider": "dav"}},
			"openstack": map[string]any{"auth_url": "https://keystone:5000/v3", "username": "u"},
		}}, check: func(t *testing.T, doc map[string]any) {
			if doc["driver"] != "openstack" || doc["openstack"].(map[string]any)["auth_url"] != "https://keystone:5000/v3" ||
				doc["agent"].(map[string]any)["mbus"] != "nats://10.0.0.6:4222" {
				t.Errorf("rendered %v", doc)
			}
		}},
	} {
		t.Run(name, func(t *testing.T) {
			out := render(t, "cpi.json.erb", tc.props)
			var doc map[string]any
			if err := json.Unmarshal([]byte(out), &doc); err != nil {
				t.Fatalf("rendered config is not JSON: %v\n%s", err, out)
			}
			tc.check(t, doc)
			if _, err := config.Parse([]byte(out), "cpi.json"); err != nil {
				t.Fatalf("bin/cpi rejects the rendered config: %v\n%s", err, out)
			}
		})
	}
}

func TestWrapperIsValidShAndExecsTheBinary(t *testing.T) {
	out := render(t, "cpi.erb", map[string]any{})
	f := filepath.Join(t.TempDir(), "cpi")
	os.WriteFile(f, []byte(out), 0o755)
	if msg, err := exec.Command("sh", "-n", f).CombinedOutput(); err != nil {
		t.Fatalf("wrapper is not valid sh: %v\n%s", err, msg)
	}
	if !strings.HasPrefix(out, "#!/bin/sh\n") ||
		!strings.Contains(out, "exec /var/vcap/packages/runway_cpi/bin/cpi -configPath /var/vcap/jobs/runway_cpi/config/cpi.json") {
		t.Fatalf("wrapper:\n%s", out)
	}
}

func TestSpecTemplatesExist(t *testing.T) {
	root := repoRoot(t)
	for _, p := range []string{"jobs/runway_cpi/templates/cpi.erb", "jobs/runway_cpi/templates/cpi.json.erb",
		"packages/runway_cpi/spec", "packages/runway_cpi/packaging", "scripts/release-prep", "packages/golang-1-linux/spec", "config/final.yml", "config/blobs.yml"} {
		if _, err := os.Stat(filepath.Join(root, p)); err != nil {
			t.Errorf("release file missing: %s", p)
		}
	}
	if msg, err := exec.Command("bash", "-n", filepath.Join(root, "packages/runway_cpi/packaging")).CombinedOutput(); err != nil {
		t.Errorf("packaging script: %v\n%s", err, msg)
	}
}

func renderJob(t *testing.T, job, template string, props map[string]any) string {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "jobs", job)
	pf := filepath.Join(t.TempDir(), "props.json")
	b, _ := json.Marshal(props)
	os.WriteFile(pf, b, 0o600)
	out, err := exec.Command("ruby", "render.rb", filepath.Join(dir, "spec"), filepath.Join(dir, "templates", template), pf).CombinedOutput()
	if err != nil {
		t.Fatalf("rendering %s/%s: %v\n%s", job, template, err, out)
	}
	return string(out)
}

// The orchestrator job renders a config `runway serve` accepts, pointing at
// the colocated runway_cpi wrapper, with tokens only in bpm's environment.
func TestOrchestratorJobRenders(t *testing.T) {
	props := map[string]any{"runway_orchestrator": map[string]any{
		"listen": "0.0.0.0:8480",
		"forges": []any{map[string]any{"name": "gitea", "type": "gitea", "url": "https://git.example",
			"token": "tok-SECRET", "webhook_secret": "hook-SECRET", "poll_interval": "20s"}},
		"groups": []any{map[string]any{"name": "linux", "scope": "org", "org": "acme", "labels": []string{"linux"},
			"max_active_runners": 4, "stemcell": map[string]any{"cid": "ami-1"}, "runner": map[string]any{"command": "/opt/runner/bootstrap"}}},
	}}
	cfgText := renderJob(t, "runway_orchestrator", "runway.yml.erb", props)
	if strings.Contains(cfgText, "tok-SECRET") || strings.Contains(cfgText, "hook-SECRET") {
		t.Fatalf("a secret is in the config file:\n%s", cfgText)
	}
	cfg, err := orchestrator.ParseConfig([]byte(cfgText))
	if err != nil {
		t.Fatalf("runway serve rejects the rendered config: %v\n%s", err, cfgText)
	}
	if cfg.CPI.Path != "/var/vcap/jobs/runway_cpi/bin/cpi" || cfg.Forges[0].TokenEnv != "RUNWAY_FORGE_GITEA_TOKEN" ||
		cfg.Forges[0].WebhookSecretEnv != "RUNWAY_FORGE_GITEA_WEBHOOK_SECRET" || cfg.Groups[0].MaxActiveRunners != 4 {
		t.Errorf("rendered config: %+v", cfg)
	}
	bpm := renderJob(t, "runway_orchestrator", "bpm.yml.erb", props)
	for _, want := range []string{"RUNWAY_FORGE_GITEA_TOKEN: tok-SECRET", "RUNWAY_FORGE_GITEA_WEBHOOK_SECRET: hook-SECRET",
		"/var/vcap/packages/runway_cpi/bin/runway", "persistent_disk: true"} {
		if !strings.Contains(bpm, want) {
			t.Errorf("bpm.yml lacks %q:\n%s", want, bpm)
		}
	}
}
