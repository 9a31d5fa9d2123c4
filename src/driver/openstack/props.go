package openstack

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/stemcellmf"
)

// mibToGiB rounds a BOSH size (MiB) up to Cinder's unit, at least 1 GiB.
func mibToGiB(mib int) int {
	if mib <= 0 {
		return 1
	}
	return (mib + 1023) / 1024
}

// rootDisk is the boot volume: size in GiB, as the official CPI reads it
// (its docs: "root_disk.size [Integer, GiB]"), unlike the MiB of AWS.
type rootDisk struct {
	SizeGiB int    `json:"size"`
	Type    string `json:"type"`
}

// vmProps are the official CPI's VM cloud properties (instance_type …
// loadbalancer_pools) and Runway's additions (root_disk.type,
// config_drive, user_data, tags).
type vmProps struct {
	InstanceType        string            `json:"instance_type"`
	AvailabilityZone    string            `json:"availability_zone"`
	AvailabilityZones   []string          `json:"availability_zones"`
	KeyName             string            `json:"key_name"`
	SecurityGroups      []string          `json:"security_groups"`
	BootFromVolume      *bool             `json:"boot_from_volume"`
	RootDisk            *rootDisk         `json:"root_disk"`
	SchedulerHints      schedulerHints    `json:"scheduler_hints"`
	AllowedAddressPairs string            `json:"allowed_address_pairs"`
	VRRPPortCheck       *bool             `json:"vrrp_port_check"`
	LoadbalancerPools   []lbPool          `json:"loadbalancer_pools"`
	EphemeralDisk       json.RawMessage   `json:"ephemeral_disk"`
	ConfigDrive         *bool             `json:"config_drive"`
	UserData            string            `json:"user_data"`
	Tags                map[string]string `json:"tags"`
}

// lbPool is an Octavia pool the VM joins: its name, the member port.
type lbPool struct {
	Name           string `json:"name"`
	Port           int    `json:"port"`
	MonitoringPort *int   `json:"monitoring_port"`
}

// schedulerHints go to Nova as they are (os:scheduler_hints), as the
// official CPI passes them: group, different_host, same_host, query, …
type schedulerHints map[string]any

func (h schedulerHints) ToSchedulerHintsMap() (map[string]any, error) {
	return map[string]any{"os:scheduler_hints": map[string]any(h)}, nil
}

func (p vmProps) validate(ignoreServerAZ bool) error {
	if p.InstanceType == "" {
		return driver.Invalid("cloud_properties.instance_type (a flavor name or id) is required")
	}
	if p.RootDisk != nil && p.RootDisk.SizeGiB < 1 {
		return driver.Invalid("cloud_properties.root_disk.size is %d; it is in GiB (as in the official CPI) and at least 1", p.RootDisk.SizeGiB)
	}
	if len(p.EphemeralDisk) > 0 {
		return fmt.Errorf("%w: cloud_properties.ephemeral_disk is not supported by the openstack driver: the flavor's ephemeral disk is the VM's (pick a flavor with one)",
			driver.ErrInvalidInput)
	}
	if p.AvailabilityZone != "" && len(p.AvailabilityZones) > 0 {
		return driver.Invalid("cloud_properties: only one of availability_zone and availability_zones may be given")
	}
	if len(p.AvailabilityZones) > 1 && !ignoreServerAZ {
		return driver.Invalid("cloud_properties.availability_zones: several zones need openstack.ignore_server_availability_zone: true (a VM's disks stay in one zone)")
	}
	for i, z := range p.AvailabilityZones {
		if z == "" {
			return driver.Invalid("cloud_properties.availability_zones[%d] is empty", i)
		}
	}
	if p.AllowedAddressPairs != "" && net.ParseIP(p.AllowedAddressPairs) == nil {
		return driver.Invalid("cloud_properties.allowed_address_pairs %q is not an IP address (the VRRP address the VM may also answer for)", p.AllowedAddressPairs)
	}
	for i, lb := range p.LoadbalancerPools {
		if lb.Name == "" {
			return driver.Invalid("cloud_properties.loadbalancer_pools[%d] has no name", i)
		}
		if lb.Port < 1 || lb.Port > 65535 {
			return driver.Invalid("cloud_properties.loadbalancer_pools[%d] (%s): port %d is not a TCP port", i, lb.Name, lb.Port)
		}
		if lb.MonitoringPort != nil && (*lb.MonitoringPort < 1 || *lb.MonitoringPort > 65535) {
			return driver.Invalid("cloud_properties.loadbalancer_pools[%d] (%s): monitoring_port %d is not a TCP port", i, lb.Name, *lb.MonitoringPort)
		}
	}
	return nil
}

type netProps struct {
	NetID          string   `json:"net_id"`
	SecurityGroups []string `json:"security_groups"`
	// VRRPPortCheck (default true): allowed_address_pairs must name the
	// address of an existing port.
	VRRPPortCheck *bool `json:"vrrp_port_check"`
}

type volumeProps struct {
	Type             string `json:"type"`
	AvailabilityZone string `json:"availability_zone"`
}

// stemcellProps are the stemcell's cloud properties. Every image property
// the official CPI passes to Glance is passed the same way (as strings),
// hypervisor becoming hypervisor_type.
type stemcellProps struct {
	// The builder's keys this driver does not read (infrastructure, disk,
	// root_device_name): no effect.
	stemcellmf.Manifest
	// ImageID names an existing Glance image: a light stemcell.
	ImageID         string            `json:"image_id"`
	DiskFormat      string            `json:"disk_format"`
	ContainerFormat string            `json:"container_format"`
	Name            string            `json:"name"`
	Version         any               `json:"version"`
	Tags            map[string]string `json:"tags"`
	OSType          any               `json:"os_type"`
	OSDistro        any               `json:"os_distro"`
	Architecture    any               `json:"architecture"`
	AutoDiskConfig  any               `json:"auto_disk_config"`
	Hypervisor      any               `json:"hypervisor"`
	HypervisorType  any               `json:"hypervisor_type"` // Runway's earlier name
	HWVifModel      any               `json:"hw_vif_model"`
	HWDiskBusModel  any               `json:"hw_disk_bus_model"`
	HWSCSIModel     any               `json:"hw_scsi_model"`
	HWDiskBus       any               `json:"hw_disk_bus"`
	HWVifMultiqueue any               `json:"hw_vif_multiqueue_enabled"`
	VMwareAdapter   any               `json:"vmware_adaptertype"`
	VMwareDiskType  any               `json:"vmware_disktype"`
	VMwareLinked    any               `json:"vmware_linked_clone"`
	VMwareOSType    any               `json:"vmware_ostype"`
}

// imageProperties are the Glance properties the stemcell asks for.
func (p stemcellProps) imageProperties() (map[string]string, error) {
	if p.Hypervisor != nil && p.HypervisorType != nil {
		return nil, driver.Invalid("cloud_properties: hypervisor and hypervisor_type name the same image property")
	}
	out := map[string]string{}
	for k, v := range map[string]any{"version": p.Version, "os_type": p.OSType, "os_distro": p.OSDistro,
		"architecture": p.Architecture, "auto_disk_config": p.AutoDiskConfig, "hw_vif_model": p.HWVifModel,
		"hw_disk_bus_model": p.HWDiskBusModel, "hw_scsi_model": p.HWSCSIModel, "hw_disk_bus": p.HWDiskBus,
		"hw_vif_multiqueue_enabled": p.HWVifMultiqueue, "hypervisor_type": firstNonNil(p.Hypervisor, p.HypervisorType),
		"vmware_adaptertype": p.VMwareAdapter, "vmware_disktype": p.VMwareDiskType,
		"vmware_linked_clone": p.VMwareLinked, "vmware_ostype": p.VMwareOSType} {
		if v == nil {
			continue
		}
		str, ok := scalar(v)
		if !ok {
			return nil, driver.Invalid("cloud_properties.%s must be a string, number or boolean", k)
		}
		out[k] = str
	}
	return out, nil
}

// scalar writes a JSON string, number or boolean as Glance wants it.
func scalar(v any) (string, bool) {
	switch v := v.(type) {
	case string:
		return v, true
	case bool:
		return strconv.FormatBool(v), true
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), true
	case json.Number:
		return v.String(), true
	}
	return "", false
}

func firstNonNil(v ...any) any {
	for _, x := range v {
		if x != nil {
			return x
		}
	}
	return nil
}

func describeNet(name string, n driver.Network) string {
	return fmt.Sprintf("network %q (%s)", name, n.Type)
}
