package kubernetes

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/retry"
)

// The driver as bin/cpi builds it: the file's section, a request context
// merged over it (config.MergeContext), then New with the
// file's section beside it. The namespace a context names must be the
// configured one or one of allowed_namespaces; every other key is the
// host's.
func TestContextMergedAsTheCPIDoes(t *testing.T) {
	reg, ok := driver.Lookup("kubernetes")
	if !ok {
		t.Fatal("kubernetes is not registered")
	}
	kubeconfig := writeKubeconfig(t)
	build := func(host map[string]any, ctx map[string]any) error {
		host["kubeconfig"] = kubeconfig
		section, _ := json.Marshal(host)
		merged, used, err := config.MergeContext(reg.Section, section, ctx)
		if err != nil {
			return err
		}
		deps := driver.Deps{}
		if len(used) > 0 {
			deps.Host = section
		}
		_, err = reg.New(merged, deps)
		return err
	}
	for _, tc := range []struct {
		name      string
		host, ctx map[string]any
		refusal   string // "" for accepted
	}{
		{"no context", map[string]any{"namespace": "runway"}, nil, ""},
		{"the configured namespace", map[string]any{"namespace": "runway"}, map[string]any{"namespace": "runway"}, ""},
		{"another namespace", map[string]any{"namespace": "runway"}, map[string]any{"namespace": "runway-agents"}, `kubernetes.namespace "runway-agents" from the request context`},
		{"another, nested", map[string]any{"namespace": "runway"}, map[string]any{"kubernetes": map[string]any{"namespace": "kube-system"}}, `"kube-system"`},
		{"an allowed one", map[string]any{"namespace": "runway", "allowed_namespaces": []string{"runway-agents"}}, map[string]any{"namespace": "runway-agents"}, ""},
		{"the identity", map[string]any{"namespace": "runway"}, map[string]any{"context": "admin"}, `"context" configures the host`},
		{"the allow list itself", map[string]any{"namespace": "runway"}, map[string]any{"allowed_namespaces": []string{"kube-system"}, "namespace": "kube-system"}, `"allowed_namespaces" configures the host`},
		{"the agent profile", map[string]any{"namespace": "runway"}, map[string]any{"bosh_agent": true}, `"bosh_agent" configures the host`},
		{"host-equivalent agents", map[string]any{"namespace": "runway"}, map[string]any{"kubernetes": map[string]any{"host_equivalent_agents": true}}, `"host_equivalent_agents" configures the host`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := build(tc.host, tc.ctx)
			switch {
			case tc.refusal == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.refusal != "" && (err == nil || !strings.Contains(err.Error(), tc.refusal)):
				t.Errorf("%v; want a refusal saying %s", err, tc.refusal)
			}
		})
	}
}

// writeKubeconfig is a kubeconfig naming an address nothing is asked of
// (building the driver asks the cluster nothing).
func writeKubeconfig(t *testing.T) string {
	t.Helper()
	path := t.TempDir() + "/kubeconfig"
	cfg := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}, {name: admin, context: {cluster: c, user: u}}]
current-context: c
`
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Bad limits and allow lists are refused by key.
func TestConfigRefusesBadLimitsAndNames(t *testing.T) {
	for _, tc := range []struct {
		extra map[string]any
		want  string
	}{
		{map[string]any{"max_cpu": -1}, "kubernetes.max_cpu"},
		{map[string]any{"max_ram": -1}, "kubernetes.max_ram"},
		{map[string]any{"max_image_mib": -1}, "kubernetes.max_image_mib"},
		{map[string]any{"max_image_entries": -1}, "kubernetes.max_image_entries"},
		{map[string]any{"allowed_namespaces": []string{"Not_A_Name"}}, "kubernetes.allowed_namespaces[0]"},
		{map[string]any{"allowed_service_accounts": []string{"ok", "../x"}}, "kubernetes.allowed_service_accounts[1]"},
	} {
		m := map[string]any{"namespace": "runway"}
		for k, v := range tc.extra {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		if _, err := parseConfig(b); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want an error naming %s", tc.extra, err, tc.want)
		}
	}
	c, err := parseConfig([]byte(`{"namespace": "runway"}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxCPU != defaultMaxCPU || c.MaxRAM != defaultMaxRAM || c.MaxImageMiB != 10240 || c.MaxImageEntries != 150000 || c.BoshAgent || c.HostEquivalentAgents {
		t.Errorf("defaults: %+v", c)
	}
}

// An agent pod asks for a user namespace of its own unless the host
// allows host-equivalent ones; no other pod says anything of it (the
// node's default, as before).
func TestAgentPodsAskForAUserNamespace(t *testing.T) {
	for _, tc := range []struct {
		cfg   string
		props vmProps
		want  string
	}{
		{`{"namespace": "runway", "bosh_agent": true}`, vmProps{BoshAgent: true}, "false"},
		{`{"namespace": "runway", "bosh_agent": true, "host_equivalent_agents": true}`, vmProps{BoshAgent: true}, "unset"},
		{`{"namespace": "runway", "bosh_agent": true}`, vmProps{}, "unset"},
	} {
		d, err := NewWithClient(json.RawMessage(tc.cfg), nil, nil, nil, retry.Policy{})
		if err != nil {
			t.Fatal(err)
		}
		pod := d.podFor("vm-x", driver.VMSpec{}, tc.props, "img", nil, nil)
		got := "unset"
		if pod.Spec.HostUsers != nil {
			got = map[bool]string{true: "true", false: "false"}[*pod.Spec.HostUsers]
		}
		if got != tc.want {
			t.Errorf("%s, agent %v: hostUsers %s; want %s", tc.cfg, tc.props.BoshAgent, got, tc.want)
		}
	}
}
