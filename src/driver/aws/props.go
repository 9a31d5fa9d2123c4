package aws

import (
	"fmt"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/stemcellmf"
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

// ephemeralProps is the official CPI's ephemeral_disk: an EBS volume at
// /dev/sdb (10 GiB gp3 unless sized), or the instance's own storage, or
// none (use_root_disk: the agent keeps its data on the root disk).
type ephemeralProps struct {
	SizeMiB            int    `json:"size"`
	Type               string `json:"type"`
	Iops               int32  `json:"iops"`
	Throughput         int32  `json:"throughput"`
	Encrypted          *bool  `json:"encrypted"`
	KMSKeyARN          string `json:"kms_key_arn"`
	UseInstanceStorage bool   `json:"use_instance_storage"`
	UseRootDisk        bool   `json:"use_root_disk"`
}

// route is an advertised_routes entry: the VM becomes the target of
// destination in route table table_id.
type route struct {
	TableID     string `json:"table_id"`
	Destination string `json:"destination"`
	TargetType  string `json:"target_type"`
}

// vmProps are the official CPI's VM cloud properties and Runway's
// additions (subnet_id, user_data).
type vmProps struct {
	InstanceType         string            `json:"instance_type"`
	AvailabilityZone     string            `json:"availability_zone"`
	KeyName              string            `json:"key_name"`
	SecurityGroups       []string          `json:"security_groups"`
	IAMInstanceProfile   string            `json:"iam_instance_profile"`
	SubnetID             string            `json:"subnet_id"`
	RootDisk             *diskProps        `json:"root_disk"`
	EphemeralDisk        *ephemeralProps   `json:"ephemeral_disk"`
	RawInstanceStorage   bool              `json:"raw_instance_storage"`
	ELBs                 []string          `json:"elbs"`
	LBTargetGroups       []string          `json:"lb_target_groups"`
	PlacementGroup       string            `json:"placement_group"`
	Tenancy              string            `json:"tenancy"`
	SpotBidPrice         *float64          `json:"spot_bid_price"`
	SpotOnDemandFallback bool              `json:"spot_ondemand_fallback"`
	SourceDestCheck      *bool             `json:"source_dest_check"`
	AdvertisedRoutes     []route           `json:"advertised_routes"`
	AutoAssignPublicIP   *bool             `json:"auto_assign_public_ip"`
	MetadataOptions      *MetadataOptions  `json:"metadata_options"`
	UserData             string            `json:"user_data"`
	Tags                 map[string]string `json:"tags"`
}

type netProps struct {
	Subnet         string   `json:"subnet"`
	SecurityGroups []string `json:"security_groups"`
}

// encryption is EBS encryption as a volume's and a stemcell's cloud
// properties set it.
type encryption struct {
	Encrypted *bool  `json:"encrypted"`
	KMSKeyARN string `json:"kms_key_arn"`
}

type volumeProps struct {
	Type       string `json:"type"`
	Iops       int32  `json:"iops"`
	Throughput int32  `json:"throughput"`
	encryption
	AvailabilityZone string            `json:"availability_zone"`
	Tags             map[string]string `json:"tags"`
}

type stemcellProps struct {
	// The builder's keys this driver does not read: no effect.
	stemcellmf.Manifest
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
	// The AMI is copied encrypted (default the job's encrypted /
	// kms_key_arn), as the official CPI does.
	encryption
	KernelID string            `json:"kernel_id"`
	Tags     map[string]string `json:"tags"`
}

func (p vmProps) validate() error {
	if p.InstanceType == "" {
		return driver.Invalid("cloud_properties.instance_type is required")
	}
	if r := p.RootDisk; r != nil && r.SizeMiB < 0 {
		return driver.Invalid("cloud_properties.root_disk.size %d must not be negative", r.SizeMiB)
	}
	if e := p.EphemeralDisk; e != nil {
		if e.SizeMiB < 0 {
			return driver.Invalid("cloud_properties.ephemeral_disk.size %d must not be negative", e.SizeMiB)
		}
		if e.UseInstanceStorage && (e.SizeMiB > 0 || e.Type != "" || e.Iops > 0 || e.Throughput > 0 || e.Encrypted != nil || e.KMSKeyARN != "") {
			return driver.Invalid("cloud_properties.ephemeral_disk.use_instance_storage cannot be combined with size, type, iops, throughput, encrypted or kms_key_arn")
		}
		if e.UseInstanceStorage && e.UseRootDisk {
			return driver.Invalid("cloud_properties.ephemeral_disk: use_instance_storage and use_root_disk exclude each other")
		}
		if e.KMSKeyARN != "" && e.Encrypted != nil && !*e.Encrypted {
			return driver.Invalid("cloud_properties.ephemeral_disk: kms_key_arn with encrypted: false")
		}
	}
	if p.RawInstanceStorage && p.EphemeralDisk != nil && p.EphemeralDisk.UseInstanceStorage {
		return driver.Invalid("cloud_properties: ephemeral_disk.use_instance_storage and raw_instance_storage exclude each other")
	}
	switch p.Tenancy {
	case "", "default", "dedicated":
	default:
		return driver.Invalid("cloud_properties.tenancy %q: default or dedicated", p.Tenancy)
	}
	if p.SpotBidPrice != nil && *p.SpotBidPrice <= 0 {
		return driver.Invalid("cloud_properties.spot_bid_price must be a positive price (USD per hour)")
	}
	if p.SpotOnDemandFallback && p.SpotBidPrice == nil {
		return driver.Invalid("cloud_properties.spot_ondemand_fallback needs spot_bid_price")
	}
	for i, r := range p.AdvertisedRoutes {
		if r.TableID == "" || r.Destination == "" {
			return driver.Invalid("cloud_properties.advertised_routes[%d] needs table_id and destination", i)
		}
		if r.TargetType != "" && r.TargetType != "instance" {
			return driver.Invalid("cloud_properties.advertised_routes[%d].target_type %q: only instance", i, r.TargetType)
		}
	}
	return nil
}

func describeNet(name string, n driver.Network) string {
	return fmt.Sprintf("network %q (%s)", name, n.Type)
}
