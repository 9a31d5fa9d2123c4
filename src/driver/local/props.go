package local

import (
	"encoding/json"

	"github.com/runway-cpi/runway/src/driver"
)

// vmProps are the local driver's VM cloud properties.
type vmProps struct {
	// Command is an argv array or a shell string.
	Command  json.RawMessage   `json:"command,omitempty"`
	UserData *string           `json:"user_data,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	// BoshAgent: the VM hosts a BOSH agent (container mode): it gets the
	// agent profile's capabilities, where local.container.bosh_agent
	// allows it. Unset: a VM booting the stemcell's agent (no command)
	// gets the profile when it is allowed.
	BoshAgent *bool `json:"bosh_agent,omitempty"`
	// What calculate_vm_cloud_properties answers comes back here: recorded.
	CPU               int `json:"cpu,omitempty"`
	RAM               int `json:"ram,omitempty"`
	EphemeralDiskSize int `json:"ephemeral_disk_size,omitempty"`
}

func decodeVMProps(p driver.Props) (vmProps, error) {
	var v vmProps
	return v, p.Decode("cloud_properties", &v)
}
