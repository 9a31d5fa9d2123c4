package release

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	boshlog "github.com/cloudfoundry/bosh-utils/logger"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver"
	_ "github.com/runway-cpi/runway/src/driver/aws"
	"github.com/runway-cpi/runway/src/driver/catalog" // the drivers bin/cpi carries: config knows their sections
	_ "github.com/runway-cpi/runway/src/driver/local"
	_ "github.com/runway-cpi/runway/src/driver/openstack"
	_ "github.com/runway-cpi/runway/src/driver/vsphere"
	orchcfg "github.com/runway-cpi/runway/src/orchestrator/config"
)

// renderRepoJob renders every file of jobs/<name> (templates and monit),
// as the Director does, and answers the output directory.
func renderRepoJob(t *testing.T, name string, props map[string]any) string {
	t.Helper()
	out := t.TempDir()
	renderJobDir(t, filepath.Join(repoRoot(t), "jobs", name), props, out)
	var spec jobSpec
	readYAMLT(t, filepath.Join(repoRoot(t), "jobs", name, "spec"), &spec)
	for _, dst := range append(mapValues(spec.Templates), "monit") {
		if _, err := os.Stat(filepath.Join(out, dst)); err != nil {
			t.Fatalf("job %s: %s was not rendered", name, dst)
		}
	}
	return out
}

// The runway_cpi job renders, for each driver, a wrapper that is valid sh
// and a config bin/cpi accepts.
func TestCPIJobRendersForEachDriver(t *testing.T) {
	for name, tc := range map[string]struct {
		props map[string]any
		check func(t *testing.T, doc map[string]any)
	}{
		"local": {props: map[string]any{"runway": map[string]any{"driver": "local", "local": map[string]any{"stop_grace_seconds": 2}}},
			check: func(t *testing.T, doc map[string]any) {
				if doc["driver"] != "local" || doc["state_dir"] != "/var/vcap/data/runway_cpi" {
					t.Errorf("rendered %v", doc)
				}
				if _, ok := doc["openstack"]; ok {
					t.Error("an unset driver section was rendered")
				}
			}},
		"openstack": {props: map[string]any{"runway": map[string]any{
			"driver": "openstack", "log_level": "debug",
			"agent":     map[string]any{"mbus": "nats://10.0.0.6:4222", "ntp": []string{"pool.ntp.org"}, "blobstore": map[string]any{"provider": "dav"}},
			"openstack": map[string]any{"auth_url": "https://keystone:5000/v3", "username": "u", "password": "p", "project_name": "x"},
		}}, check: func(t *testing.T, doc map[string]any) {
			if doc["driver"] != "openstack" || doc["openstack"].(map[string]any)["auth_url"] != "https://keystone:5000/v3" ||
				doc["agent"].(map[string]any)["mbus"] != "nats://10.0.0.6:4222" {
				t.Errorf("rendered %v", doc)
			}
		}},
		"official agent properties (bosh create-env manifests)": {props: map[string]any{"runway": map[string]any{"driver": "local"},
			"agent": map[string]any{"mbus": "https://mbus:p@0.0.0.0:6868"}, "ntp": []string{"time.example"},
			"blobstore": map[string]any{"provider": "local", "options": map[string]any{"blobstore_path": "/var/vcap/micro_bosh/data/cache"}}},
			check: func(t *testing.T, doc map[string]any) {
				agent := doc["agent"].(map[string]any)
				if agent["mbus"] != "https://mbus:p@0.0.0.0:6868" || agent["ntp"].([]any)[0] != "time.example" ||
					agent["blobstore"].(map[string]any)["provider"] != "local" {
					t.Errorf("agent section %v", agent)
				}
			}},
		// bosh-deployment's bosh.yml gives the Director's instance group
		// (where the CPI job runs) its dav blobstore: the agents get the
		// endpoint (https: the blobstore has a TLS CA) and the agent's
		// credentials; the Director's own never reach them.
		"bosh-deployment's dav blobstore": {props: map[string]any{"runway": map[string]any{"driver": "local"},
			"blobstore": map[string]any{"address": "10.0.0.6", "port": 25250, "provider": "dav",
				"agent":    map[string]any{"user": "agent", "password": "agent-pw"},
				"director": map[string]any{"user": "director", "password": "director-pw"},
				"tls":      map[string]any{"cert": map[string]any{"ca": testPEM, "certificate": "server-cert", "private_key": "server-key"}}}},
			check: func(t *testing.T, doc map[string]any) {
				bs := doc["agent"].(map[string]any)["blobstore"].(map[string]any)
				opts := bs["options"].(map[string]any)
				if bs["provider"] != "dav" || opts["endpoint"] != "https://10.0.0.6:25250" || opts["user"] != "agent" || opts["password"] != "agent-pw" ||
					opts["tls"].(map[string]any)["cert"].(map[string]any)["ca"] != testPEM {
					t.Errorf("agent blobstore %v", bs)
				}
				if b, _ := json.Marshal(doc); strings.Contains(string(b), "director-pw") || strings.Contains(string(b), "server-key") {
					t.Errorf("the Director's credentials reached the config: %s", b)
				}
			}},
		// The official local form (a create-env's bosh-lite): blobstore_path.
		"official local blobstore": {props: map[string]any{"runway": map[string]any{"driver": "local"},
			"blobstore": map[string]any{"provider": "local", "path": "/var/vcap/micro_bosh/data/cache"}},
			check: func(t *testing.T, doc map[string]any) {
				bs := doc["agent"].(map[string]any)["blobstore"].(map[string]any)
				if bs["provider"] != "local" || bs["options"].(map[string]any)["blobstore_path"] != "/var/vcap/micro_bosh/data/cache" {
					t.Errorf("agent blobstore %v", bs)
				}
			}},
		// s3: the agent's own keys win over the Director's.
		"official s3 blobstore": {props: map[string]any{"runway": map[string]any{"driver": "local"},
			"blobstore": map[string]any{"provider": "s3", "bucket_name": "b", "access_key_id": "dir-key", "secret_access_key": "dir-secret",
				"s3_region": "eu-west-1"},
			"agent": map[string]any{"blobstore": map[string]any{"access_key_id": "agent-key", "secret_access_key": "agent-secret"}}},
			check: func(t *testing.T, doc map[string]any) {
				opts := doc["agent"].(map[string]any)["blobstore"].(map[string]any)["options"].(map[string]any)
				if opts["bucket_name"] != "b" || opts["access_key_id"] != "agent-key" || opts["secret_access_key"] != "agent-secret" || opts["region"] != "eu-west-1" {
					t.Errorf("agent blobstore options %v", opts)
				}
			}},
		"aws": {props: map[string]any{"runway": map[string]any{"driver": "aws", "aws": map[string]any{"region": "eu-west-1"}}},
			check: func(t *testing.T, doc map[string]any) {
				if doc["driver"] != "aws" || doc["aws"].(map[string]any)["region"] != "eu-west-1" {
					t.Errorf("rendered %v", doc)
				}
			}},
		// An official openstack_cpi manifest, unchanged: the driver
		// follows from openstack.*, which reach bin/cpi by their names.
		"official openstack_cpi properties": {props: map[string]any{
			"openstack": map[string]any{"auth_url": "https://keystone:5000/v3", "username": "bosh", "api_key": "pw",
				"project": "prod", "domain": "Default", "default_key_name": "bosh", "default_security_groups": []string{"bosh"},
				"state_timeout": 600, "config_drive": "cdrom", "use_dhcp": false,
				"connection_options": map[string]any{"ca_cert": testPEM, "read_timeout": 360}},
			"nats": map[string]any{"user": "n", "password": "np", "address": "10.0.0.6"}},
			check: func(t *testing.T, doc map[string]any) {
				os := doc["openstack"].(map[string]any)
				if doc["driver"] != "openstack" || os["api_key"] != "pw" || os["project"] != "prod" || os["state_timeout"] != 600.0 ||
					doc["agent"].(map[string]any)["mbus"] != "nats://n:np@10.0.0.6:4222" {
					t.Errorf("rendered %v", doc)
				}
			}},
		"official aws_cpi properties": {props: map[string]any{
			"aws": map[string]any{"credentials_source": "env_or_profile", "region": "eu-central-1", "default_key_name": "bosh",
				"default_security_groups": []string{"bosh"}, "max_retries": 8, "encrypted": true,
				"connection_options": map[string]any{"ca_cert": testPEM}, "metadata_options": map[string]any{"http_tokens": "required"}},
			"env": map[string]any{"https_proxy": "http://proxy:3128"}},
			check: func(t *testing.T, doc map[string]any) {
				aws := doc["aws"].(map[string]any)
				if doc["driver"] != "aws" || aws["credentials_source"] != "env_or_profile" || aws["connection_options"].(map[string]any)["ca_cert"] != testPEM {
					t.Errorf("rendered %v", doc)
				}
			}},
		// An official vsphere_cpi manifest (bosh.io's example), unchanged:
		// the driver follows from vcenter.*.
		"official vsphere_cpi properties": {props: map[string]any{
			"vcenter": map[string]any{"address": "172.16.68.3", "user": "root", "password": "vmware", "default_disk_type": "thin",
				"enable_auto_anti_affinity_drs_rules": true, "connection_options": map[string]any{"ca_cert": testPEM},
				"datacenters": []any{map[string]any{"name": "BOSH_DC", "vm_folder": "prod-vms", "template_folder": "prod-templates",
					"disk_path": "prod-disks", "datastore_pattern": `\Aprod-ds\z`, "persistent_datastore_pattern": `\Aprod-ds\z`,
					"clusters": []any{map[string]any{"BOSH_CL": map[string]any{"resource_pool": "BOSH_RP"}}}}}},
			"nats": map[string]any{"user": "n", "password": "np", "address": "10.0.0.6"}},
			check: func(t *testing.T, doc map[string]any) {
				vs := doc["vsphere"].(map[string]any)
				if doc["driver"] != "vsphere" || vs["address"] != "172.16.68.3" || vs["password"] != "vmware" ||
					vs["datacenters"].([]any)[0].(map[string]any)["disk_path"] != "prod-disks" ||
					doc["agent"].(map[string]any)["mbus"] != "nats://n:np@10.0.0.6:4222" {
					t.Errorf("rendered %v", doc)
				}
			}},
	} {
		t.Run(name, func(t *testing.T) {
			out := renderRepoJob(t, "runway_cpi", tc.props)
			text := readFile(t, filepath.Join(out, "config", "cpi.json"))
			var doc map[string]any
			if err := json.Unmarshal([]byte(text), &doc); err != nil {
				t.Fatalf("rendered config is not JSON: %v\n%s", err, text)
			}
			tc.check(t, doc)
			cfg, err := config.Parse([]byte(text), "cpi.json")
			if err != nil {
				t.Fatalf("bin/cpi rejects the rendered config: %v\n%s", err, text)
			}
			// The driver takes its section as rendered (keys, units).
			reg, _ := driver.Lookup(cfg.Driver)
			if _, err := reg.New(cfg.DriverSection(), driver.Deps{StateDir: t.TempDir(), Logger: boshlog.NewLogger(boshlog.LevelNone)}); err != nil {
				t.Fatalf("driver %s rejects its rendered section: %v\n%s", cfg.Driver, err, text)
			}
			wrapper := filepath.Join(out, "bin", "cpi")
			if msg, err := exec.Command("sh", "-n", wrapper).CombinedOutput(); err != nil {
				t.Fatalf("wrapper is not valid sh: %v\n%s", err, msg)
			}
		})
	}
}

// Every driver of the table can be chosen through the job: runway.<name>
// is a property, and its section reaches the config.
func TestCPIJobCarriesEveryDriver(t *testing.T) {
	var spec struct {
		Properties map[string]any `yaml:"properties"`
	}
	readYAMLT(t, filepath.Join(repoRoot(t), "jobs", "runway_cpi", "spec"), &spec)
	for _, d := range catalog.Names() {
		if _, ok := spec.Properties["runway."+d]; !ok {
			t.Errorf("jobs/runway_cpi/spec has no runway.%s", d)
			continue
		}
		out := renderRepoJob(t, "runway_cpi", map[string]any{"runway": map[string]any{"driver": d, d: map[string]any{"marker": d}}})
		var doc map[string]any
		if err := json.Unmarshal([]byte(readFile(t, filepath.Join(out, "config", "cpi.json"))), &doc); err != nil {
			t.Fatal(err)
		}
		if sec, _ := doc[d].(map[string]any); doc["driver"] != d || sec["marker"] != d {
			t.Errorf("runway.driver %s: rendered driver %v, section %v", d, doc["driver"], doc[d])
		}
	}
}

// The job never falls back to a driver silently: none chosen, two IaaS's
// properties, or properties of another IaaS than runway.driver fail the
// render with a message naming what to set.
func TestCPIJobRefusesToGuessTheDriver(t *testing.T) {
	for name, tc := range map[string]struct {
		props map[string]any
		want  string
	}{
		"nothing":              {map[string]any{"ntp": []string{"x"}}, "no driver chosen: set runway.driver (local, openstack, aws, kubernetes or vsphere), or the official openstack.*, aws.* or vcenter.* properties"},
		"two IaaS's":           {map[string]any{"openstack": map[string]any{"auth_url": "http://k/v3"}, "aws": map[string]any{"region": "r"}}, "the official properties of several IaaSes are set (openstack.*: auth_url; aws.*: region)"},
		"vcenter and aws":      {map[string]any{"vcenter": map[string]any{"host": "vc"}, "aws": map[string]any{"region": "r"}}, "vcenter.*: host"},
		"vcenter, not vsphere": {map[string]any{"runway": map[string]any{"driver": "local"}, "vcenter": map[string]any{"host": "vc"}}, "runway.driver is local but vcenter.* properties are set (host)"},
		"another IaaS":         {map[string]any{"runway": map[string]any{"driver": "local"}, "aws": map[string]any{"region": "r"}}, "runway.driver is local but aws.* properties are set (region)"},
	} {
		t.Run(name, func(t *testing.T) {
			pf := filepath.Join(t.TempDir(), "props.json")
			b, _ := json.Marshal(tc.props)
			os.WriteFile(pf, b, 0o600)
			msg, err := exec.Command("ruby", "render.rb", filepath.Join(repoRoot(t), "jobs", "runway_cpi"), pf, t.TempDir()).CombinedOutput()
			if err == nil || !strings.Contains(string(msg), tc.want) {
				t.Fatalf("render: %v\n%s\nwant it to fail saying %q", err, msg, tc.want)
			}
		})
	}
}

// The orchestrator job renders a config `runway serve` accepts, pointing at
// the colocated runway_cpi wrapper, with tokens only in secrets.env, and a
// ctl script that is valid bash.
func TestOrchestratorJobRenders(t *testing.T) {
	props := map[string]any{"runway_orchestrator": map[string]any{
		"listen": "0.0.0.0:8480",
		"forges": []any{map[string]any{"name": "gitea", "type": "gitea", "url": "https://git.example",
			"token": "tok-SECRET'$(x)", "webhook_secret": "hook-SECRET", "poll_interval": "20s"}},
		"groups": []any{map[string]any{"name": "linux", "scope": "org", "org": "acme", "labels": []string{"linux"},
			"max_active_runners": 4, "stemcell": map[string]any{"cid": "ami-1"}, "runner": map[string]any{"command": "/opt/runner/bootstrap"}}},
	}}
	out := renderRepoJob(t, "runway_orchestrator", props)
	cfgText := readFile(t, filepath.Join(out, "config", "runway.yml"))
	if strings.Contains(cfgText, "tok-SECRET") || strings.Contains(cfgText, "hook-SECRET") {
		t.Fatalf("a secret is in the config file:\n%s", cfgText)
	}
	cfg, err := orchcfg.ParseConfig([]byte(cfgText))
	if err != nil {
		t.Fatalf("runway serve rejects the rendered config: %v\n%s", err, cfgText)
	}
	if cfg.CPI.Path != "/var/vcap/jobs/runway_cpi/bin/cpi" || cfg.Forges[0].TokenEnv != "RUNWAY_FORGE_GITEA_TOKEN" ||
		cfg.Forges[0].WebhookSecretEnv != "RUNWAY_FORGE_GITEA_WEBHOOK_SECRET" || cfg.Groups[0].MaxActiveRunners != 4 {
		t.Errorf("rendered config: %+v", cfg)
	}
	// secrets.env is sourced by bash: a token with quotes and $(...) must
	// come back exactly, not run.
	env := filepath.Join(out, "config", "secrets.env")
	got, err := exec.Command("bash", "-c", `set -a; . "$1"; printf '%s|%s' "$RUNWAY_FORGE_GITEA_TOKEN" "$RUNWAY_FORGE_GITEA_WEBHOOK_SECRET"`, "-", env).Output()
	if err != nil || string(got) != "tok-SECRET'$(x)|hook-SECRET" {
		t.Errorf("secrets.env gives %q (%v):\n%s", got, err, readFile(t, env))
	}
	if msg, err := exec.Command("bash", "-n", filepath.Join(out, "bin", "ctl")).CombinedOutput(); err != nil {
		t.Fatalf("ctl is not valid bash: %v\n%s", err, msg)
	}
	if cfg.Store != "sqlite" {
		t.Errorf("store without postgres.dsn: %q, want sqlite", cfg.Store)
	}

	// With a DSN: store postgres, the DSN only in secrets.env.
	props["runway_orchestrator"].(map[string]any)["postgres"] = map[string]any{"dsn": "postgres://runway:pw-SECRET@db:5432/runway"}
	out2 := renderRepoJob(t, "runway_orchestrator", props)
	cfgText = readFile(t, filepath.Join(out2, "config", "runway.yml"))
	if strings.Contains(cfgText, "pw-SECRET") {
		t.Fatalf("the DSN is in the config file:\n%s", cfgText)
	}
	if cfg, err = orchcfg.ParseConfig([]byte(cfgText)); err != nil || cfg.Store != "postgres" || cfg.Postgres.DSNEnv != "RUNWAY_POSTGRES_DSN" {
		t.Errorf("rendered config with postgres.dsn: %+v (%v)\n%s", cfg, err, cfgText)
	}
	got, err = exec.Command("bash", "-c", `set -a; . "$1"; printf '%s' "$RUNWAY_POSTGRES_DSN"`, "-", filepath.Join(out2, "config", "secrets.env")).Output()
	if err != nil || string(got) != "postgres://runway:pw-SECRET@db:5432/runway" {
		t.Errorf("secrets.env gives the DSN as %q (%v)", got, err)
	}
	monit := readFile(t, filepath.Join(out, "monit"))
	for _, want := range []string{"check process runway_orchestrator", "/var/vcap/jobs/runway_orchestrator/bin/ctl start",
		"/var/vcap/sys/run/runway_orchestrator/runway_orchestrator.pid"} {
		if !strings.Contains(monit, want) {
			t.Errorf("monit lacks %q:\n%s", want, monit)
		}
	}
}

func mapValues(m map[string]string) []string {
	var out []string
	for _, v := range m {
		out = append(out, v)
	}
	return out
}

// testPEM is a self-signed certificate (content irrelevant, PEM valid).
var testPEM = func() string {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(1)}, &x509.Certificate{SerialNumber: big.NewInt(1)}, &key.PublicKey, key)
	return string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
}()
