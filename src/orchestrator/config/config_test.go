package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

const minimal = `
state_dir: /tmp/x
cpi: {path: /bin/cpi}
forges:
  - {name: gitea, type: gitea, url: "https://gitea.example", token_file: /etc/token}
groups:
  - name: linux
    scope: org
    org: acme
    labels: [linux]
    max_active_runners: 2
    stemcell: {cid: sc-1}
    runner: {command: /usr/bin/runner}
`

func TestConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte(minimal))
	if err != nil {
		t.Fatal(err)
	}
	g := c.Groups[0]
	if g.Forge != "gitea" || g.Timeouts.Idle.Duration != 15*time.Minute || g.SpawnConcurrency != 4 ||
		c.Forges[0].PollInterval.Duration != 15*time.Second || c.Forges[0].RunnerURL != "https://gitea.example" ||
		c.CPI.Timeout.Duration != 10*time.Minute || c.Listen != "127.0.0.1:8480" || c.Store != "sqlite" {
		t.Errorf("defaults: %+v %+v", c, g)
	}
	if s := g.ForgeScope(); s.Kind != "org" || s.Owner != "acme" {
		t.Errorf("scope %+v", s)
	}
	if h := c.HTTP; h.MaxConnections != 256 || h.MaxConnectionsPerClient != 64 || h.ReadBodyTimeout.Duration != 10*time.Second {
		t.Errorf("http defaults: %+v", h)
	}
	if c, _ := ParseConfig([]byte(minimal + "http: {max_connections: 2}\n")); c.HTTP.MaxConnectionsPerClient != 1 {
		t.Errorf("a quarter of 2 connections per client: %d, want 1", c.HTTP.MaxConnectionsPerClient)
	}
}

// A forge URL refused is named without its user info or query values.
func TestRefusedURLIsRedacted(t *testing.T) {
	_, err := ParseConfig([]byte(strings.Replace(minimal, "https://gitea.example", "ftp://canary-user:canary-pass@gitea.example/keep-seg?token=canary-query", 1)))
	if err == nil || strings.Contains(err.Error(), "canary") || !strings.Contains(err.Error(), "forges[0].url") || !strings.Contains(err.Error(), "/keep-seg?token=<redacted>") {
		t.Errorf("error %v", err)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	for _, c := range []struct{ from, to, field string }{
		{"scope: org", "scope: team", "groups[0].scope"},
		{"    org: acme\n", "", "groups[0].org"},
		{"labels: [linux]", "labels: []", "groups[0].labels"},
		// Seed 001's own label shape: the runner reads "infra" as a schema.
		{"labels: [linux]", "labels: [linux, \"app:infra\"]", `groups[0].labels[1]: "app:infra" cannot be registered as written`},
		{"labels: [linux]", "labels: [\"linux:lxc://debian\"]", `groups[0].labels[0]: "linux:lxc://debian" cannot be registered as written`},
		{"max_active_runners: 2", "max_active_runners: 0", "groups[0].max_active_runners"},
		{"stemcell: {cid: sc-1}", "stemcell: {cid: sc-1, image: /x.tgz}", "groups[0].stemcell"},
		{"stemcell: {cid: sc-1}", "stemcell: {}", "groups[0].stemcell: set exactly one of cid or image, or cloud_properties alone"},
		{"token_file: /etc/token", "token_file: /etc/token, token_env: T", "forges[0].token_file"},
		{"type: gitea", "type: gitlab", "forges[0].type"},
		{"type: gitea, url", "type: forgejo, webhook_secret_env: S, url", "forges[0].webhook_secret_file: Forgejo sends no workflow_job webhook"},
		{"name: linux", "name: Linux_1", "groups[0].name"},
		{"runner: {command: /usr/bin/runner}", "runner: {command: /usr/bin/runner, env: {\"A-B\": x}}", "groups[0].runner.env"},
		{"max_active_runners: 2", "max_active_runners: 2\n    timeouts: {idle: soon}", "soon"},
		{"max_active_runners: 2", "max_active_runners: 2\n    colour: blue", "colour"},
		{"state_dir: /tmp/x", "state_dir: /tmp/x\nstore: mysql", "store"},
		{"state_dir: /tmp/x", "state_dir: /tmp/x\nstore: postgres", "postgres.dsn_file"},
		{"state_dir: /tmp/x", "state_dir: /tmp/x\nstore: postgres\npostgres: {dsn_file: /a, dsn_env: B}", "postgres.dsn_file"},
		{"state_dir: /tmp/x", "state_dir: /tmp/x\npostgres: {dsn_file: /a}", "postgres"},
		{"state_dir: /tmp/x", "state_dir: /tmp/x\nstore: postgres\npostgres: {dsn: \"postgres://u:p@h/db\"}", "dsn"},
		// Type errors name the field (and the line), not only the line.
		{"max_active_runners: 2", "max_active_runners: lots", `groups[0].max_active_runners: must be an integer, got a string "lots" (line 11)`},
		{"state_dir: /tmp/x", "state_dir: /tmp/x\nhttp: {read_timeout: 1ns}", "http.read_timeout: 1ns is too short"},
		{"state_dir: /tmp/x", "state_dir: /tmp/x\nhttp: {read_body_timeout: 5ms}", "http.read_body_timeout: 5ms is too short"},
		{"state_dir: /tmp/x", "state_dir: /tmp/x\nhttp: {max_connections: 8, max_connections_per_client: 9}", "http.max_connections_per_client: 9 must be between 1 and http.max_connections (8)"},
		{"state_dir: /tmp/x", "state_dir: /tmp/x\nhttp: {max_connections_per_client: -1}", "http.max_connections_per_client: -1"},
		{"cpi: {path: /bin/cpi}", "cpi: {path: /bin/cpi, stemcell_api_version: -7}", "cpi.stemcell_api_version: -7"},
		{"cpi: {path: /bin/cpi}", "cpi: {path: /bin/cpi, stemcell_api_version: [1]}", "cpi.stemcell_api_version: must be an integer, got a list"},
	} {
		_, err := ParseConfig([]byte(strings.Replace(minimal, c.from, c.to, 1)))
		if err == nil || !strings.Contains(err.Error(), c.field) {
			t.Errorf("%s → %s: error %v does not name %s", c.from, c.to, err, c.field)
		}
	}
	light := strings.Replace(minimal, "stemcell: {cid: sc-1}", "stemcell: {cloud_properties: {image: registry.example/runner:1}}", 1)
	if _, err := ParseConfig([]byte(light)); err != nil {
		t.Errorf("a light stemcell (cloud properties only): %v", err)
	}
	if _, err := ParseConfig([]byte(strings.Replace(minimal, "type: gitea", "type: forgejo", 1))); err != nil {
		t.Errorf("a forgejo forge: %v", err)
	}
	gh := strings.Replace(minimal, "type: gitea", "type: github", 1)
	gh = strings.Replace(gh, "scope: org\n    org: acme", "scope: global", 1)
	if _, err := ParseConfig([]byte(gh)); err == nil || !strings.Contains(err.Error(), "not supported on GitHub") {
		t.Errorf("global scope on GitHub: %v", err)
	}
}

// A group's demand: forge by default; scale_set only on GitHub, its
// scale_set keys only then, its name within what a scale set may be.
func TestDemandIsCheckedByField(t *testing.T) {
	gh := strings.Replace(minimal, `{name: gitea, type: gitea, url: "https://gitea.example", token_file: /etc/token}`,
		`{name: gh, type: github, token_file: /etc/token}`, 1)
	c, err := ParseConfig([]byte(gh))
	if err != nil || c.Groups[0].Demand != DemandForge {
		t.Fatalf("default demand: %v, %v", c, err)
	}
	ok := gh + "    demand: scale_set\n    scale_set: {name: runway-linux_1.x, runner_group_id: 3}\n"
	if c, err := ParseConfig([]byte(ok)); err != nil || c.Groups[0].ScaleSet.RunnerGroupID != 3 {
		t.Fatalf("a scale-set group: %v", err)
	}
	for _, c := range []struct{ yaml, field string }{
		{minimal + "    demand: scale_set\n", "groups[0].demand"},
		{gh + "    demand: webhooks\n", "groups[0].demand"},
		{gh + "    scale_set: {name: x}\n", "groups[0].scale_set"},
		{gh + "    demand: scale_set\n    scale_set: {name: \"no spaces\"}\n", "groups[0].scale_set.name"},
		{gh + "    demand: scale_set\n    scale_set: {runner_group_id: -1}\n", "groups[0].scale_set.runner_group_id"},
	} {
		_, err := ParseConfig([]byte(c.yaml))
		if err == nil || !strings.Contains(err.Error(), c.field+":") {
			t.Errorf("%q: %v; want an error naming %s", c.yaml[len(minimal)-20:], err, c.field)
		}
	}
}

// GHES's and GHE.com's URL forms beside github.com's (issue 47): a GitHub
// forge's REST URL gives the web URL its runners and scale sets are
// registered under, unless runner_url says otherwise. Before issue 47
// every GitHub forge defaulted to https://github.com.
func TestGitHubURLForms(t *testing.T) {
	for api, want := range map[string]string{
		"https://api.github.com":           "https://github.com",
		"https://ghes.example.com/api/v3":  "https://ghes.example.com",
		"https://ghes.example.com/api/v3/": "https://ghes.example.com",
		"http://127.0.0.1:8443/api/v3":     "http://127.0.0.1:8443",
		"https://api.acme.ghe.com":         "https://acme.ghe.com",
	} {
		cfg := strings.Replace(minimal, `{name: gitea, type: gitea, url: "https://gitea.example", token_file: /etc/token}`,
			`{name: gitea, type: github, url: "`+api+`", token_file: /etc/token}`, 1)
		c, err := ParseConfig([]byte(cfg))
		if err != nil {
			t.Fatalf("%s: %v", api, err)
		}
		if got := c.Forges[0].RunnerURL; got != want {
			t.Errorf("url %s: runner_url %q, want %q", api, got, want)
		}
	}
}

// A set handed over by another source (the Kubernetes controller) is
// refused field by field, each refusal typed with the list and index of
// the forge or group at fault: the source reads which of its objects it
// was with errors.As, never the message.
func TestPrepareSetRefusalsCarryTheirItem(t *testing.T) {
	forges := []ForgeConfig{{Name: "ok", Type: "gitea", URL: "https://gitea.example", TokenFile: "/t"},
		{Name: "bad", Type: "gitlab", URL: "https://gitlab.example", TokenFile: "/t"}}
	good := GroupConfig{Name: "a", Forge: "ok", Scope: "org", Org: "acme", Labels: []string{"linux"}, MaxActiveRunners: 1,
		Stemcell: StemcellConfig{CID: "sc"}, Runner: RunnerConfig{Command: "/r"}}
	bad := good
	bad.Name, bad.Labels = "b", nil
	err := PrepareSet(forges, []GroupConfig{good, bad})
	var got []string
	for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
		var fe *FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("%v: not a FieldError", e)
		}
		got = append(got, fmt.Sprintf("%s %d %s", fe.List, fe.Index, fe.InItem()))
	}
	if want := "forges 1 type,groups 1 labels"; strings.Join(got, ",") != want {
		t.Errorf("refusals %q, want %q (%v)", got, want, err)
	}
	var fe *FieldError
	if errors.As(err, &fe); fe.Field != "forges[1].type" || fe.Error() != `forges[1].type: "gitlab" must be gitea, forgejo or github` {
		t.Errorf("the first refusal reads %q", fe.Error())
	}
}
