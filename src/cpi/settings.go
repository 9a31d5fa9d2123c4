package cpi

import (
	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver"
)

// AgentSettings is what a registry-less (stemcell API >= 2) agent reads from
// user data / metadata. Field names follow bosh-agent's settings.
type AgentSettings struct {
	AgentID   string          `json:"agent_id"`
	VM        VMName          `json:"vm"`
	Mbus      string          `json:"mbus,omitempty"`
	NTP       []string        `json:"ntp"`
	Blobstore map[string]any  `json:"blobstore,omitempty"`
	Networks  driver.Networks `json:"networks"`
	Disks     AgentDisks      `json:"disks"`
	Env       map[string]any  `json:"env"`
}

// VMName is the settings' vm section.
type VMName struct {
	Name string `json:"name"`
}

// AgentDisks is the settings' disks section.
type AgentDisks struct {
	System     string         `json:"system"`
	Ephemeral  any            `json:"ephemeral"`
	Persistent map[string]any `json:"persistent"`
}

func newAgentSettings(agent config.Agent, agentID, vmName string, nets driver.Networks, env map[string]any) AgentSettings {
	ntp := agent.NTP
	if ntp == nil {
		ntp = []string{}
	}
	if env == nil {
		env = map[string]any{}
	}
	return AgentSettings{
		AgentID: agentID, VM: VMName{Name: vmName},
		Mbus: agent.Mbus, NTP: ntp, Blobstore: agent.Blobstore,
		Networks: nets, Env: env,
		Disks: AgentDisks{System: "/dev/sda", Ephemeral: "/dev/sdb", Persistent: map[string]any{}},
	}
}
