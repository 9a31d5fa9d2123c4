package store

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/stemcellmf"
)

// VM is vms/<cid>/vm.json. The environment is not kept here: it may
// hold secrets and reaches the VM through its settings file only.
type VM struct {
	CID         string            `json:"cid"`
	AgentID     string            `json:"agent_id"`
	StemcellCID string            `json:"stemcell_cid"`
	CloudProps  driver.Props      `json:"cloud_properties"`
	Networks    driver.Networks   `json:"networks"`
	Tags        map[string]string `json:"tags"`
	Metadata    map[string]string `json:"metadata"`
	Command     []string          `json:"command,omitempty"`
	// Isolation is "container" for a container VM (the config may change
	// while it lives; deleting it must still undo what made it).
	Isolation string `json:"isolation,omitempty"`
	// IDs is a container VM's range of host ids (its user namespace).
	IDs *storage.IDRange `json:"ids,omitempty"`
	// Port: a container VM's host-side interface.
	Port string `json:"port,omitempty"`
	// Agent: the VM has the BOSH agent profile.
	Agent bool `json:"agent,omitempty"`
	// OwnDirs: the agent VM's /var/vcap/data and /home are file systems of
	// its own; a VM made before they were keeps its writes there in its
	// root's layer.
	OwnDirs bool `json:"own_dirs,omitempty"`
	// DiskMounts: how a container VM gets its persistent disks, from its
	// stemcell: "" (bind) or DiskMountsService.
	DiskMounts string `json:"disk_mounts,omitempty"`
	Stopped    bool   `json:"stopped,omitempty"`
	CreatedAt  string `json:"created_at"`
}

// LoadVM reads a VM record; a missing VM is ErrVMNotFound.
func (s *Store) LoadVM(cid string) (*VM, error) { return Load[VM](s, VMs, cid) }

// VMProps are the local driver's VM cloud properties.
type VMProps struct {
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

// DecodeVMProps decodes a VM's cloud properties strictly.
func DecodeVMProps(p driver.Props) (VMProps, error) {
	var v VMProps
	return v, p.Decode("cloud_properties", &v)
}

// Disk is disks/<cid>/disk.json; AttachedTo is the one source of truth
// for attachments (the VM's disks/ symlinks are derived from it).
type Disk struct {
	CID        string            `json:"cid"`
	SizeMiB    int               `json:"size_mib"`
	CloudProps driver.Props      `json:"cloud_properties"`
	Tags       map[string]string `json:"tags"`
	Metadata   map[string]string `json:"metadata"`
	AttachedTo string            `json:"attached_to,omitempty"`
	// Format: DiskFormatExt4 for a file system image (DiskImage, made in
	// container mode: a device of its own in the VM, its size enforced);
	// empty for a directory (data/, process mode).
	Format string `json:"format,omitempty"`
	// HeldBy is the VM that kept the disk's file system past its
	// detach_disk and was cut off from it; the disk is used again once
	// that VM lets go of it.
	HeldBy    string `json:"held_by,omitempty"`
	NearVM    string `json:"near_vm,omitempty"`
	CreatedAt string `json:"created_at"`
}

// A disk made in container mode is disks/<cid>/disk.img.
const (
	DiskFormatExt4 = "ext4"
	DiskImage      = "disk.img"
)

// LoadDisk reads a disk record; a missing disk is ErrDiskNotFound.
func (s *Store) LoadDisk(cid string) (*Disk, error) { return Load[Disk](s, Disks, cid) }

// Stemcell is stemcells/<cid>/stemcell.json.
type Stemcell struct {
	CID        string            `json:"cid"`
	CloudProps driver.Props      `json:"cloud_properties"`
	Tags       map[string]string `json:"tags"`
	Source     string            `json:"source"`
	CreatedAt  string            `json:"created_at"`
}

// StemcellProps: what stemcell.MF files carry in cloud_properties,
// recorded; the local driver reads persistent_disks only:
// DiskMountsBind (the default: a warden stemcell's agent binds
// /warden-cpi-dev/<disk>) or DiskMountsService (its agent mounts the
// disk itself, through the VM's mount service).
type StemcellProps struct {
	stemcellmf.Manifest
}

// How a container VM's agent gets its persistent disks.
const (
	DiskMountsBind    = "bind"
	DiskMountsService = "mount_service"
)

// DiskMounts answers a stemcell's persistent_disks, checked.
func (p StemcellProps) DiskMounts() (string, error) {
	switch v := p.PersistentDisks.(type) {
	case nil:
		return DiskMountsBind, nil
	case string:
		if v == DiskMountsBind || v == DiskMountsService {
			return v, nil
		}
	}
	return "", driver.Invalid("stemcell cloud_properties.persistent_disks: %q is neither %q nor %q", fmt.Sprint(p.PersistentDisks), DiskMountsBind, DiskMountsService)
}

// DiskMountsOf answers how VMs of stemcell cid take their disks.
func (s *Store) DiskMountsOf(cid string) (string, error) {
	rec, err := Load[Stemcell](s, Stemcells, cid)
	if err != nil {
		return "", err
	}
	var props StemcellProps
	if err := rec.CloudProps.Decode("stemcell cloud_properties", &props); err != nil {
		return "", err
	}
	return props.DiskMounts()
}

// ImageDir is a stemcell's unpacked image.
func (s *Store) ImageDir(stemcell string) string {
	return filepath.Join(s.Dir(Stemcells, stemcell), "image")
}

// Snapshot is snapshots/<cid>/snapshot.json.
type Snapshot struct {
	CID       string            `json:"cid"`
	DiskCID   string            `json:"disk_cid"`
	SizeMiB   int               `json:"size_mib"`
	Metadata  map[string]string `json:"metadata"`
	CreatedAt string            `json:"created_at"`
}

// DiskLink is where disk appears in VM vm's directory (disks/<disk>, a
// link to the disk's data).
func (s *Store) DiskLink(vm, disk string) string {
	return filepath.Join(s.Dir(VMs, vm), "disks", disk)
}

// OwnerAlive: a VM being created or existing still owns its addresses.
// The checks follow the publishing rename (.creating-<cid> → <cid>): looked
// at in the other order, a VM published between the two looks dead.
func (s *Store) OwnerAlive(cid string) bool {
	for _, p := range []string{filepath.Join(s.Root, "vms", ".creating-"+cid), s.Dir(VMs, cid)} {
		if _, err := os.Stat(p); err == nil {
			return true
		}
	}
	return false
}

// LiveVMs are the VMs published or being created, by one read of vms/:
// what looks dead here is asked again of OwnerAlive (a VM published
// during the read may be missed by it).
func (s *Store) LiveVMs() map[string]bool {
	entries, _ := os.ReadDir(filepath.Join(s.Root, VMs.dir))
	live := make(map[string]bool, len(entries))
	for _, e := range entries {
		live[strings.TrimPrefix(e.Name(), ".creating-")] = true
	}
	return live
}

// VMExists: a VM published or being created (its create holds the name).
func (s *Store) VMExists(vm string) bool {
	for _, p := range []string{s.Dir(VMs, vm), filepath.Join(s.Root, VMs.dir, ".creating-"+vm)} {
		if _, err := os.Lstat(p); err == nil {
			return true
		}
	}
	return false
}

// DisksAttachedTo lists the disks whose records say attached to vm.
func (s *Store) DisksAttachedTo(vm string) ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(s.Root, Disks.dir))
	if err != nil && !isNotExist(err) {
		return nil, err
	}
	out := []string{}
	for _, e := range entries {
		if CheckCID("disk", e.Name()) != nil {
			continue // a .creating- or .deleting- directory
		}
		if rec, err := s.LoadDisk(e.Name()); err == nil && rec.AttachedTo == vm {
			out = append(out, rec.CID)
		}
	}
	return out, nil
}

// NewCID is a fresh CID: prefix and a random UUID.
func NewCID(prefix string) (string, error) {
	id, err := uuid.NewRandom()
	if err != nil {
		return "", err
	}
	return prefix + id.String(), nil
}

// Now is a record's time stamp.
func Now() string { return time.Now().UTC().Format(time.RFC3339) }
