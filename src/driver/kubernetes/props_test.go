package kubernetes

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/retry"
)

// A VM type places its pod only as the operator's config lists: a
// toleration of every taint, one of the control plane's taint, the
// control plane's node label, a pod affinity reaching into every
// namespace are each refused naming the property and the config key;
// what the config lists (a toleration written without its operator, as
// the scheduler reads it: Equal) is taken.
func TestSchedulingOnlyAsTheConfigLists(t *testing.T) {
	var cfg Config
	if err := json.Unmarshal([]byte(`{
	  "allowed_tolerations": [{"key": "runners", "operator": "Equal", "value": "yes", "effect": "NoSchedule"}],
	  "allowed_node_selectors": ["pool=runners"],
	  "allowed_affinities": [{"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms":
	    [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["runners"]}]}]}}}]}`), &cfg); err != nil {
		t.Fatal(err)
	}
	cfg.MaxCPU, cfg.MaxRAM = 16, 65536
	if err := cfg.allowLists(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ props, refused string }{
		{`{"tolerations": [{"operator": "Exists"}]}`, "cloud_properties.tolerations[0]"},
		{`{"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]}`, "allowed_tolerations"},
		{`{"tolerations": [{"key": "runners", "value": "yes", "effect": "NoSchedule"}, {"key": "runners", "value": "yes"}]}`, "cloud_properties.tolerations[1]"},
		{`{"node_selector": {"node-role.kubernetes.io/control-plane": ""}}`, `node_selector "node-role.kubernetes.io/control-plane="`},
		{`{"node_selector": {"pool": "runners", "kubernetes.io/hostname": "node-1"}}`, `"kubernetes.io/hostname=node-1" is not one of kubernetes.allowed_node_selectors (pool=runners)`},
		{`{"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {"matchLabels": {"app": "vault"}},
		   "namespaceSelector": {}, "topologyKey": "kubernetes.io/hostname"}]}}}`, "cloud_properties.affinity is not one of kubernetes.allowed_affinities"},
		{`{"tolerations": [{"key": "runners", "value": "yes", "effect": "NoSchedule"}], "node_selector": {"pool": "runners"},
		   "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms":
		   [{"matchExpressions": [{"key": "pool", "operator": "In", "values": ["runners"]}]}]}}}}`, ""},
	} {
		_, err := decodeVMProps(driver.PropsOf(json.RawMessage(c.props)), cfg)
		if (err != nil) != (c.refused != "") || (err != nil && !strings.Contains(err.Error(), c.refused)) {
			t.Errorf("%s: %v, want refused naming %q", c.props, err, c.refused)
		}
	}
	if _, err := decodeVMProps(driver.PropsOf(json.RawMessage(`{"tolerations": [{"operator": "Exists"}]}`)), Config{MaxCPU: 1, MaxRAM: 1}); err == nil {
		t.Error("a toleration with no allow list: taken")
	}
	bad := Config{AllowedNodeSelectors: []string{"pool"}}
	if err := bad.allowLists(); err == nil || !strings.Contains(err.Error(), "allowed_node_selectors[0]") {
		t.Errorf("allowed_node_selectors without =: %v", err)
	}
}

// The config's host_aliases reach every pod (a forge's name where pods
// have no DNS for it); a VM type cannot set them.
func TestHostAliasesFromTheConfigOnly(t *testing.T) {
	d, err := NewWithClient(json.RawMessage(`{"namespace": "runway", "host_aliases": [{"ip": "10.99.0.1", "hostnames": ["gitea.runway.test"]}]}`),
		nil, nil, nil, retry.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	pod := d.podFor("vm-x", driver.VMSpec{}, vmProps{}, "img", nil, nil)
	if len(pod.Spec.HostAliases) != 1 || pod.Spec.HostAliases[0].Hostnames[0] != "gitea.runway.test" {
		t.Errorf("hostAliases %+v", pod.Spec.HostAliases)
	}
	if _, err := decodeVMProps(driver.PropsOf(json.RawMessage(`{"host_aliases": [{"ip": "10.96.0.1", "hostnames": ["gitea.runway.test"]}]}`)),
		Config{MaxCPU: 1, MaxRAM: 1}); err == nil {
		t.Error("a VM type's host_aliases: taken")
	}
}
