package kubernetes

import (
	"encoding/json"
	"testing"
)

// The agent's settings say the pod's network is set up: a real agent
// given a dynamic network that is not preconfigured writes its network
// configuration and stops ("lstat /etc/systemd/network: no such file or
// directory", the dev cluster with the real agent and Director). The rest
// of the settings are kept as the CPI wrote them.
func TestAgentSettingsSayTheNetworkIsTheClusters(t *testing.T) {
	d := &Driver{cfg: Config{Owner: "runway-cpi"}}
	// As src/cpi writes them from a Director's create_vm.
	in := `{"agent_id":"a1","vm":{"name":"vm-1"},"mbus":"nats://10.99.0.1:4222","ntp":[],
	  "networks":{"default":{"type":"dynamic","cloud_properties":{},"default":["dns","gateway"],"dns":["8.8.8.8"]}},
	  "disks":{"system":"/dev/sda","ephemeral":"/dev/sdb","persistent":{}},"env":{"bosh":{"mbus":{"cert":{"ca":"CA"}}}}}`
	s := d.settingsSecret("vm-1", []byte(in), "")
	var got, want map[string]any
	if err := json.Unmarshal(s.Data[agentSettingsKey], &got); err != nil {
		t.Fatalf("settings: %v: %s", err, s.Data[agentSettingsKey])
	}
	json.Unmarshal([]byte(in), &want)
	want["networks"].(map[string]any)["default"].(map[string]any)["preconfigured"] = true
	g, _ := json.Marshal(got)
	w, _ := json.Marshal(want)
	if string(g) != string(w) {
		t.Errorf("settings:\n%s\nwant\n%s", g, w)
	}
}
