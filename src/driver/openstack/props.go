package openstack

import (
	"fmt"

	"github.com/runway-cpi/runway/src/driver"
)

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
