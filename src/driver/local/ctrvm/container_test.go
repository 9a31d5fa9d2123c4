package ctrvm

import (
	"encoding/json"
	"testing"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/container"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

func TestWithAddressesFillsTheNetworksTheVMGot(t *testing.T) {
	in := []byte(`{"agent_id":"a","networks":{"default":{"type":"dynamic","dns":["1.1.1.1"]}}}`)
	out := withAddresses(in, driver.Networks{"default": {Type: "dynamic", IP: "10.244.0.9", Netmask: "255.255.0.0", Gateway: "10.244.0.1"}})
	var m struct {
		AgentID  string                    `json:"agent_id"`
		Networks map[string]map[string]any `json:"networks"`
	}
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	n := m.Networks["default"]
	if m.AgentID != "a" || n["ip"] != "10.244.0.9" || n["gateway"] != "10.244.0.1" || n["dns"] == nil {
		t.Errorf("settings after: %s", out)
	}
	if got := withAddresses([]byte(`"not an object"`), driver.Networks{}); string(got) != `"not an object"` {
		t.Errorf("non-object settings changed: %s", got)
	}
}

// A VM whose cloud properties name no limits gets the configured defaults:
// never an unlimited VM.
func TestOCISpecDefaultLimits(t *testing.T) {
	v := &VMs{st: &store.Store{Root: "/var/lib/runway"}, cfg: Config{PidsLimit: 100, DefaultRAMMiB: 2048, DefaultCPU: 2}}
	ram, cpu := v.limits(store.VMProps{})
	s, err := container.Spec(container.VM{CID: "vm-1", Argv: []string{"/bin/true"}, RAMMiB: ram, CPU: cpu, Pids: v.cfg.PidsLimit})
	if err != nil {
		t.Fatal(err)
	}
	if s.Linux.Resources.Memory == nil || *s.Linux.Resources.Memory.Limit != 2048<<20 || *s.Linux.Resources.Memory.Swap != 2048<<20 {
		t.Errorf("memory %+v", s.Linux.Resources.Memory)
	}
	if s.Linux.Resources.CPU == nil || *s.Linux.Resources.CPU.Quota != 200000 {
		t.Errorf("cpu %+v", s.Linux.Resources.CPU)
	}
}
