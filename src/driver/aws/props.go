package aws

import (
	"fmt"

	"github.com/runway-cpi/runway/src/driver"
)

// mibToGiB rounds a BOSH size (MiB) up to EBS's unit, at least 1 GiB.
func mibToGiB(mib int) int32 {
	if mib <= 0 {
		return 1
	}
	return int32((mib + 1023) / 1024)
}

type diskProps struct {
	SizeMiB    int    `json:"size"`
	Type       string `json:"type"`
	Iops       int32  `json:"iops"`
	Throughput int32  `json:"throughput"`
}

type vmProps struct {
	InstanceType       string            `json:"instance_type"`
	AvailabilityZone   string            `json:"availability_zone"`
	KeyName            string            `json:"key_name"`
	SecurityGroups     []string          `json:"security_groups"`
	IAMInstanceProfile string            `json:"iam_instance_profile"`
	SubnetID           string            `json:"subnet_id"`
	RootDisk           *diskProps        `json:"root_disk"`
	EphemeralDisk      *diskProps        `json:"ephemeral_disk"`
	UserData           string            `json:"user_data"`
	Tags               map[string]string `json:"tags"`
}

type netProps struct {
	Subnet         string   `json:"subnet"`
	SecurityGroups []string `json:"security_groups"`
}

type volumeProps struct {
	Type             string `json:"type"`
	Iops             int32  `json:"iops"`
	Throughput       int32  `json:"throughput"`
	Encrypted        *bool  `json:"encrypted"`
	KMSKeyARN        string `json:"kms_key_arn"`
	AvailabilityZone string `json:"availability_zone"`
}

type stemcellProps struct {
	// AMI per region: a light stemcell.
	AMI                map[string]string `json:"ami"`
	Architecture       string            `json:"architecture"`
	RootDeviceName     string            `json:"root_device_name"`
	VirtualizationType string            `json:"virtualization_type"`
	Name               string            `json:"name"`
	Version            string            `json:"version"`
	BootMode           string            `json:"boot_mode"`
	// DiskMiB sizes the snapshot (at least the raw image's size).
	DiskMiB int `json:"disk"`
}

func (p vmProps) validate() error {
	if p.InstanceType == "" {
		return driver.Invalid("cloud_properties.instance_type is required")
	}
	for _, d := range []*diskProps{p.RootDisk, p.EphemeralDisk} {
		if d != nil && d.SizeMiB < 0 {
			return driver.Invalid("disk size %d must not be negative", d.SizeMiB)
		}
	}
	return nil
}

func describeNet(name string, n driver.Network) string {
	return fmt.Sprintf("network %q (%s)", name, n.Type)
}
