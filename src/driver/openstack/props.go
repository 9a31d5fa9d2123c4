package openstack

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/runway-cpi/runway/src/driver"
)

// decodeProps reads free-form cloud properties into a typed struct. Keys
// it does not know are ignored (cloud properties are shared with hooks and
// other tools); a known key with the wrong type is an input error.
func decodeProps(what string, p map[string]any, into any) error {
	if len(p) == 0 {
		return nil
	}
	b, err := json.Marshal(p)
	if err != nil {
		return driver.Invalid("%s: %v", what, err)
	}
	if err := json.Unmarshal(b, into); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return driver.Invalid("%s.%s must be %s, not %s", what, te.Field, kindName(te.Type.Kind().String()), te.Value)
		}
		return driver.Invalid("%s: %v", what, err)
	}
	return nil
}

func kindName(k string) string {
	switch k {
	case "int", "int32", "int64":
		return "an integer"
	case "slice":
		return "a list"
	case "map", "struct", "ptr":
		return "an object"
	case "bool":
		return "a boolean"
	}
	return "a " + k
}

// mibToGiB rounds a BOSH size (MiB) up to Cinder's unit, at least 1 GiB.
func mibToGiB(mib int) int {
	if mib <= 0 {
		return 1
	}
	return (mib + 1023) / 1024
}

type rootDisk struct {
	SizeMiB int    `json:"size"`
	Type    string `json:"type"`
}

type vmProps struct {
	InstanceType     string            `json:"instance_type"`
	AvailabilityZone string            `json:"availability_zone"`
	KeyName          string            `json:"key_name"`
	SecurityGroups   []string          `json:"security_groups"`
	BootFromVolume   *bool             `json:"boot_from_volume"`
	RootDisk         *rootDisk         `json:"root_disk"`
	ConfigDrive      *bool             `json:"config_drive"`
	UserData         string            `json:"user_data"`
	Tags             map[string]string `json:"tags"`
}

func (p vmProps) validate() error {
	if p.InstanceType == "" {
		return driver.Invalid("cloud_properties.instance_type (a flavor name or id) is required")
	}
	if p.RootDisk != nil && p.RootDisk.SizeMiB < 0 {
		return driver.Invalid("cloud_properties.root_disk.size %d must not be negative", p.RootDisk.SizeMiB)
	}
	return nil
}

type netProps struct {
	NetID          string   `json:"net_id"`
	SecurityGroups []string `json:"security_groups"`
}

type volumeProps struct {
	Type             string `json:"type"`
	AvailabilityZone string `json:"availability_zone"`
}

type stemcellProps struct {
	// ImageID names an existing Glance image: a light stemcell.
	ImageID         string `json:"image_id"`
	DiskFormat      string `json:"disk_format"`
	ContainerFormat string `json:"container_format"`
	Name            string `json:"name"`
	Version         any    `json:"version"`
	OSDistro        string `json:"os_distro"`
	Architecture    string `json:"architecture"`
	HypervisorType  string `json:"hypervisor_type"`
}

func describeNet(name string, n driver.Network) string {
	return fmt.Sprintf("network %q (%s)", name, n.Type)
}
