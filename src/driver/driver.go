// Package driver defines what every IaaS implements. Drivers know nothing
// of the wire: they return the sentinel errors below and the CPI service
// maps them to BOSH error types.
package driver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strconv"
)

// Sentinel errors. Wrap them (fmt.Errorf("...: %w", ErrVMNotFound)) to add
// detail; the service matches with errors.Is.
var (
	ErrVMNotFound       = errors.New("vm not found")
	ErrDiskNotFound     = errors.New("disk not found")
	ErrDiskNotAttached  = errors.New("disk not attached")
	ErrStemcellNotFound = errors.New("stemcell not found")
	ErrNotSupported     = errors.New("not supported")
	ErrInvalidInput     = errors.New("invalid input")
	ErrNoDiskSpace      = errors.New("no disk space")
	// ErrNotImplemented: the driver has the method, this IaaS lacks what
	// it needs (the Director then carries on without it).
	ErrNotImplemented = errors.New("not implemented here")
)

// CreationError reports a create_vm failure; Retryable says whether the
// same call can succeed if repeated (capacity, transient faults).
type CreationError struct {
	Err       error
	Retryable bool
}

func (e *CreationError) Error() string { return "vm creation failed: " + e.Err.Error() }
func (e *CreationError) Unwrap() error { return e.Err }

// Invalid wraps ErrInvalidInput with a message.
func Invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidInput, fmt.Sprintf(format, args...))
}

// Network is one entry of the BOSH networks hash.
type Network struct {
	Type            string   `json:"type,omitempty"` // manual | dynamic | vip
	IP              string   `json:"ip,omitempty"`
	Netmask         string   `json:"netmask,omitempty"`
	Gateway         string   `json:"gateway,omitempty"`
	DNS             []string `json:"dns,omitempty"`
	Default         []string `json:"default,omitempty"`
	MAC             string   `json:"mac,omitempty"`
	CloudProperties Props    `json:"cloud_properties"`
	// Prefix is the Director's prefix length for the network's address
	// ("32" for one IPv4 address); a shorter one is a delegated prefix.
	// NICGroup puts several networks on one interface (AWS); drivers
	// without interfaces to share accept it with no effect, as the
	// official OpenStack CPI does.
	Prefix   Prefix `json:"prefix,omitempty"`
	NICGroup string `json:"nic_group,omitempty"`
}

// Prefix is a prefix length as the Director sends it ("32"); a number is
// taken too, and it is always written as the string the agent reads.
type Prefix string

// UnmarshalJSON takes a string or a number.
func (p *Prefix) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	switch x := v.(type) {
	case nil:
		*p = ""
	case string:
		*p = Prefix(x)
	case float64:
		*p = Prefix(strconv.FormatFloat(x, 'f', -1, 64))
	default:
		return &json.UnmarshalTypeError{Value: kindOfJSON(b), Type: reflect.TypeFor[string]()}
	}
	return nil
}

// Networks is the networks hash, by network name.
type Networks map[string]Network

// VMSpec is everything create_vm needs.
type VMSpec struct {
	// Name is unique per call (vm-<uuid>); drivers use it as the CID or the
	// server name so a VM can be found even if create_vm dies part-way.
	Name        string
	AgentID     string
	StemcellCID string
	CloudProps  Props
	Networks    Networks
	DiskCIDs    []string
	Env         map[string]any
	// AgentSettings is the JSON the driver delivers to the VM (user data,
	// metadata, a file); nil for stemcell API v1 callers.
	AgentSettings []byte
	// Tags identify the creator (director uuid, agent id, caller tags).
	Tags map[string]string
}

// VM is what create_vm answers.
type VM struct {
	CID      string
	Networks Networks // with the addresses actually assigned
}

// VMInfo describes an existing VM for listings.
type VMInfo struct {
	CID      string
	AgentID  string
	Tags     map[string]string
	Metadata map[string]string
	State    string // running | stopped | error | unknown
	Networks Networks
}

// DiskSpec is everything create_disk needs.
type DiskSpec struct {
	SizeMiB    int
	CloudProps Props
	VMCID      string // may be empty: disk placed near this VM when given
	Tags       map[string]string
}

// Decode reads the disk's cloud properties into into (as Props.Decode
// does) and refuses a size that is not positive: every cloud driver's
// first step of create_disk.
func (s DiskSpec) Decode(into any) error {
	if err := s.CloudProps.Decode("cloud_properties", into); err != nil {
		return err
	}
	if s.SizeMiB <= 0 {
		return Invalid("disk size %d MiB must be positive", s.SizeMiB)
	}
	return nil
}

// StemcellSpec is everything create_stemcell needs.
type StemcellSpec struct {
	ImagePath  string
	CloudProps Props
	Tags       map[string]string // API v3 env.tags plus creator tags
}

// Resources is calculate_vm_cloud_properties' input.
type Resources struct {
	CPU               int `json:"cpu"`
	RAM               int `json:"ram"`                 // MiB
	EphemeralDiskSize int `json:"ephemeral_disk_size"` // MiB
}

// Driver is one IaaS: what the BOSH Director needs of every CPI. Methods
// must be safe to call from concurrent processes against the same IaaS:
// locks are the driver's business. What some IaaS cannot do lives in the
// small interfaces below; the service answers NotImplemented for a driver
// that lacks one, so a new IaaS can start with this core.
type Driver interface {
	// StemcellFormats lists the stemcell formats the driver accepts.
	StemcellFormats() []string

	CreateStemcell(ctx context.Context, spec StemcellSpec) (string, error)
	DeleteStemcell(ctx context.Context, cid string) error

	CreateVM(ctx context.Context, spec VMSpec) (VM, error)
	DeleteVM(ctx context.Context, cid string) error
	HasVM(ctx context.Context, cid string) (bool, error)
	RebootVM(ctx context.Context, cid string) error
	SetVMMetadata(ctx context.Context, cid string, md map[string]string) error

	CreateDisk(ctx context.Context, spec DiskSpec) (string, error)
	DeleteDisk(ctx context.Context, cid string) error
	HasDisk(ctx context.Context, cid string) (bool, error)
	// AttachDisk returns the disk hint handed to the agent (non-empty).
	AttachDisk(ctx context.Context, vmCID, diskCID string) (any, error)
	DetachDisk(ctx context.Context, vmCID, diskCID string) error
	GetDisks(ctx context.Context, vmCID string) ([]string, error)
}

// VMSizer answers calculate_vm_cloud_properties.
type VMSizer interface {
	CalculateVMCloudProperties(ctx context.Context, r Resources) (Props, error)
}

// VMLister answers list_vms: the VMs carrying every tag in match (reapers,
// garm, the orchestrator).
type VMLister interface {
	ListVMs(ctx context.Context, match map[string]string) ([]VMInfo, error)
}

// PowerSwitch powers a VM off, keeping it, and on again (garm's
// StopInstance/StartInstance).
type PowerSwitch interface {
	StopVM(ctx context.Context, cid string) error
	StartVM(ctx context.Context, cid string) error
}

// DiskResizer grows disks in place.
type DiskResizer interface {
	ResizeDisk(ctx context.Context, cid string, sizeMiB int) error
	// UpdateDisk returns the disk's CID afterwards (a new one if replaced).
	UpdateDisk(ctx context.Context, cid string, sizeMiB int, props Props) (string, error)
}

// DiskMetadata labels disks.
type DiskMetadata interface {
	SetDiskMetadata(ctx context.Context, cid string, md map[string]string) error
}

// Snapshotter snapshots disks.
type Snapshotter interface {
	SnapshotDisk(ctx context.Context, cid string, md map[string]string) (string, error)
	DeleteSnapshot(ctx context.Context, cid string) error
}

// Complete is the core interface and every optional one: what a driver
// that answers every CPI method implements (checked at compile time).
type Complete interface {
	Driver
	VMSizer
	VMLister
	PowerSwitch
	DiskResizer
	DiskMetadata
	Snapshotter
}
