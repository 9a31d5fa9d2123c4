// Package stemcellmf is the cloud_properties a stemcell's manifest
// (stemcell.MF) carries, which every driver's stemcell properties take.
package stemcellmf

// Manifest is the cloud_properties every real stemcell carries:
// what the stemcell builder writes into stemcell.MF for any infrastructure
// (bosh-linux-stemcell-builder: bosh-stemcell's stemcell_packager.rb and
// infrastructure.rb) and bosh.io's light stemcells keep (infrastructure).
// The Director and bosh-cli pass them to create_stemcell verbatim. A
// driver embeds it in its stemcell props: the keys it reads it declares
// again with their types (the outer field wins); the rest are accepted and
// have no effect (docs/configuration.md, "Stemcell cloud properties").
type Manifest struct {
	Name            any `json:"name"`
	Version         any `json:"version"`
	Infrastructure  any `json:"infrastructure"`
	Hypervisor      any `json:"hypervisor"`
	Disk            any `json:"disk"`
	DiskFormat      any `json:"disk_format"`
	ContainerFormat any `json:"container_format"`
	OSType          any `json:"os_type"`
	OSDistro        any `json:"os_distro"`
	Architecture    any `json:"architecture"`
	AutoDiskConfig  any `json:"auto_disk_config"`
	RootDeviceName  any `json:"root_device_name"`
	// PersistentDisks is Runway's own: how the stemcell's agent takes its
	// persistent disks in the local driver's container mode (see there);
	// the other drivers accept and ignore it.
	PersistentDisks any `json:"persistent_disks"`
}
