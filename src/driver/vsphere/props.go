package vsphere

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/stemcellmf"
)

// vmProps are the official VM cloud properties (docs/vsphere.md).
type vmProps struct {
	CPU  int `json:"cpu"`
	RAM  int `json:"ram"`  // MiB
	Disk int `json:"disk"` // MiB: the ephemeral disk

	CPUHotAddEnabled             bool           `json:"cpu_hot_add_enabled,omitempty"`
	MemoryHotAddEnabled          bool           `json:"memory_hot_add_enabled,omitempty"`
	NestedHardwareVirtualization bool           `json:"nested_hardware_virtualization,omitempty"`
	UpgradeHWVersion             *bool          `json:"upgrade_hw_version,omitempty"`
	MemoryReservationLockedToMax *bool          `json:"memory_reservation_locked_to_max,omitempty"`
	VMXOptions                   map[string]any `json:"vmx_options,omitempty"`
	Datacenters                  []vmDatacenter `json:"datacenters,omitempty"`
	Datastores                   []storageRef   `json:"datastores,omitempty"`
	VMGroup                      string         `json:"vm_group,omitempty"`

	// Refused when set: what Runway does not do on vSphere.
	StoragePolicy      any  `json:"storage_policy,omitempty"`
	NSX                any  `json:"nsx,omitempty"`
	NSXT               any  `json:"nsxt,omitempty"`
	Tags               any  `json:"tags,omitempty"`
	DisableDRS         bool `json:"disable_drs,omitempty"`
	CPUReserveFullMHz  bool `json:"cpu_reserve_full_mhz,omitempty"`
	PCIPassthroughs    any  `json:"pci_passthroughs,omitempty"`
	VGPUs              any  `json:"vgpus,omitempty"`
	DeviceGroups       any  `json:"device_groups,omitempty"`
	RootDiskSizeGB     int  `json:"root_disk_size_gb,omitempty"`
	HumanReadableNames bool `json:"enable_human_readable_name,omitempty"`
}

// vmDatacenter overrides placement: the clusters (with pools) to use.
type vmDatacenter struct {
	Name     string       `json:"name,omitempty"`
	Clusters []ClusterRef `json:"clusters"`
}

// storageRef is a datastore name; {clusters: [...]} (datastore clusters)
// is refused by name.
type storageRef string

// UnmarshalJSON takes a name; a datastore cluster entry is refused.
func (s *storageRef) UnmarshalJSON(b []byte) error {
	var name string
	if err := json.Unmarshal(b, &name); err == nil {
		*s = storageRef(name)
		return nil
	}
	return errors.New("datastore clusters ({clusters: [...]}) are not supported: name datastores")
}

func (p *vmProps) validate(cfg Config) error {
	switch {
	case p.CPU <= 0:
		return driver.Invalid("cloud_properties.cpu must be a positive number of CPUs (required, as the official CPI)")
	case p.RAM <= 0:
		return driver.Invalid("cloud_properties.ram must be a positive number of MiB (required, as the official CPI)")
	case p.Disk <= 0:
		return driver.Invalid("cloud_properties.disk must be a positive number of MiB: the ephemeral disk (required, as the official CPI)")
	}
	refused := []struct {
		set      bool
		key, why string
	}{
		{p.StoragePolicy != nil, "storage_policy", "storage policies (PBM) are not supported: name datastores"},
		{p.NSX != nil, "nsx", "NSX-V is not supported"},
		{p.NSXT != nil, "nsxt", "NSX-T is not supported"},
		{p.Tags != nil, "tags", "vSphere tags are not supported: BOSH metadata are set as custom fields"},
		{p.DisableDRS, "disable_drs", "Runway leaves DRS on for every VM"},
		{p.CPUReserveFullMHz, "cpu_reserve_full_mhz", "Runway reserves no CPU"},
		{p.PCIPassthroughs != nil, "pci_passthroughs", "PCI passthrough is not supported"},
		{p.VGPUs != nil, "vgpus", "vGPUs are not supported"},
		{p.DeviceGroups != nil, "device_groups", "device groups are not supported"},
		{p.RootDiskSizeGB != 0, "root_disk_size_gb", "the root disk keeps the stemcell's size (linked clones)"},
		{p.HumanReadableNames, "enable_human_readable_name", "VMs are named vm-<uuid>"},
	}
	for _, r := range refused {
		if r.set {
			return fmt.Errorf("%w: cloud_properties.%s: %s", driver.ErrNotSupported, r.key, r.why)
		}
	}
	if len(p.Datacenters) > 1 {
		return driver.Invalid("cloud_properties.datacenters must list one datacenter, not %d (as the official CPI)", len(p.Datacenters))
	}
	if len(p.Datacenters) == 1 {
		dc := p.Datacenters[0]
		if dc.Name != "" && dc.Name != cfg.dc().Name {
			return driver.Invalid("cloud_properties.datacenters[0].name %q is not the configured datacenter %q", dc.Name, cfg.dc().Name)
		}
		if len(dc.Clusters) == 0 {
			return driver.Invalid("cloud_properties.datacenters[0].clusters must name at least one cluster")
		}
	}
	if err := checkVMX("cloud_properties.vmx_options", p.VMXOptions); err != nil {
		return driver.Invalid("%v", err)
	}
	return nil
}

// clusterRefs are the clusters a VM may go to.
func (p *vmProps) clusterRefs(cfg Config) []ClusterRef {
	if len(p.Datacenters) == 1 {
		return p.Datacenters[0].Clusters
	}
	return cfg.dc().Clusters
}

// ephemeral is where the ephemeral disk and the stemcell replica go.
func (p *vmProps) ephemeral(cfg Config) matcher {
	if len(p.Datastores) > 0 {
		m := matcher{}
		for _, n := range p.Datastores {
			m.names = append(m.names, string(n))
		}
		return m
	}
	return patternMatcher(cfg.dc().DatastorePattern)
}

// vmx is the config's vmx_options with the cloud properties' over them.
func (p *vmProps) vmx(cfg Config) map[string]string {
	out := map[string]string{}
	for _, m := range []map[string]any{cfg.VMXOptions, p.VMXOptions} {
		for k, v := range m {
			out[k] = fmt.Sprint(v)
		}
	}
	return out
}

// diskUUIDs reports whether disk.enableUUID is on: the agent then finds
// disks by their UUID instead of their unit number.
func diskUUIDs(vmx map[string]string) bool {
	switch vmx["disk.enableUUID"] {
	case "1", "TRUE", "true":
		return true
	}
	return false
}

// diskProps are the official disk cloud properties.
type diskProps struct {
	// Type: thin, preallocated (zeroed on demand), thick (as
	// preallocated) or eagerZeroedThick; default default_disk_type.
	Type       string       `json:"type,omitempty"`
	Datastores []storageRef `json:"datastores,omitempty"`
}

// diskType is vSphere's VirtualDiskType for a disk type.
func diskType(t string) (string, error) {
	switch t {
	case "thin":
		return "thin", nil
	case "preallocated", "thick":
		return "preallocated", nil
	case "eagerZeroedThick":
		return "eagerZeroedThick", nil
	}
	return "", driver.Invalid("cloud_properties.type %q: want thin, preallocated, thick or eagerZeroedThick", t)
}

// networkProps are a network's cloud properties: the port group.
type networkProps struct {
	Name string `json:"name"`
}

// stemcellProps are the stemcell's cloud properties (stemcell.MF).
type stemcellProps struct {
	stemcellmf.Manifest
}
