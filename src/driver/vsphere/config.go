package vsphere

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/poll"
	"github.com/runway-cpi/runway/src/strict"
)

// Config is the "vsphere" section: one vCenter, as one entry of the
// official CPI's vcenters list (which is taken too, and spread here).
type Config struct {
	// Host is the vCenter's address (host or host:port); the SDK is at
	// https://<host>/sdk.
	Host     string `json:"host"`
	User     string `json:"user"`
	Password string `json:"password"`
	// Datacenters holds exactly one datacenter, as the official CPI.
	Datacenters []Datacenter `json:"datacenters"`

	ConnectionOptions ConnectionOptions `json:"connection_options,omitempty"`
	// Insecure skips verifying vCenter's certificate (Runway's own key:
	// without a CA, Runway trusts the system's roots, never nothing).
	Insecure bool `json:"insecure,omitempty"`

	// DefaultDiskType: thin or preallocated (default), for stemcell,
	// ephemeral and persistent disks unless a disk type says otherwise.
	DefaultDiskType string `json:"default_disk_type,omitempty"`
	// DefaultSCSIControllerType: paravirtual (default), lsi_logic or
	// lsi_logic_sas: the controller every VM's disks hang off.
	DefaultSCSIControllerType string `json:"default_scsi_controller_type,omitempty"`
	// EnableAutoAntiAffinityDRSRules puts each instance group's VMs into a
	// DRS rule keeping them on separate hosts.
	EnableAutoAntiAffinityDRSRules bool `json:"enable_auto_anti_affinity_drs_rules,omitempty"`
	// MemoryReservationLockedToMax reserves every VM's memory.
	MemoryReservationLockedToMax bool `json:"memory_reservation_locked_to_max,omitempty"`
	// UpgradeHWVersion upgrades VMs to the newest hardware version the
	// host supports; otherwise DefaultHWVersion (default 17) is set.
	UpgradeHWVersion bool `json:"upgrade_hw_version,omitempty"`
	DefaultHWVersion int  `json:"default_hw_version,omitempty"`
	// EnsureNoIPConflicts (default true) refuses a VM whose manual IP a
	// VM on the same port group already reports.
	EnsureNoIPConflicts *bool `json:"ensure_no_ip_conflicts,omitempty"`
	// VMXOptions go into every VM's extraConfig (cloud properties add).
	VMXOptions map[string]any `json:"vmx_options,omitempty"`

	// poll_max_ms and wait_timeout_seconds.
	poll.Polling
	// RequestTimeoutSeconds bounds each vCenter request (default 120;
	// uploads are bounded by the wait timeout instead).
	RequestTimeoutSeconds int `json:"request_timeout_seconds,omitempty"`
	// SessionCache keeps the vCenter session in the state dir for the
	// next bin/cpi process (default true).
	SessionCache *bool `json:"session_cache,omitempty"`
}

// ConnectionOptions are the official connection_options.
type ConnectionOptions struct {
	// CACert is a PEM bundle that vCenter's certificate must chain to.
	CACert string `json:"ca_cert,omitempty"`
}

// Datacenter is one entry of datacenters.
type Datacenter struct {
	Name           string `json:"name"`
	VMFolder       string `json:"vm_folder,omitempty"`
	TemplateFolder string `json:"template_folder,omitempty"`
	DiskPath       string `json:"disk_path,omitempty"`
	// DatastorePattern picks datastores for stemcells and ephemeral disks;
	// PersistentDatastorePattern for persistent disks (regular expressions).
	DatastorePattern           string `json:"datastore_pattern,omitempty"`
	PersistentDatastorePattern string `json:"persistent_datastore_pattern,omitempty"`
	// AllowMixedDatastores is accepted with no effect (deprecated by the
	// official CPI, whose config never reads it).
	AllowMixedDatastores *bool `json:"allow_mixed_datastores,omitempty"`
	// Refused when set (Storage DRS pods, per-Director sub-folders).
	DatastoreClusterPattern           string       `json:"datastore_cluster_pattern,omitempty"`
	PersistentDatastoreClusterPattern string       `json:"persistent_datastore_cluster_pattern,omitempty"`
	UseSubFolder                      bool         `json:"use_sub_folder,omitempty"`
	Clusters                          []ClusterRef `json:"clusters"`
}

// ClusterRef is a cluster by name, or {name: {resource_pool: ...}}.
type ClusterRef struct {
	Name         string
	ResourcePool string
}

// clusterOptions are what a cluster entry may say.
type clusterOptions struct {
	ResourcePool string `json:"resource_pool,omitempty"`
	HostGroup    any    `json:"host_group,omitempty"`
	DRSRules     []struct {
		Name string `json:"name"`
		Type string `json:"type"`
	} `json:"drs_rules,omitempty"`
}

// UnmarshalJSON takes "name" or {"name": {options}} (one key).
func (c *ClusterRef) UnmarshalJSON(b []byte) error {
	var name string
	if json.Unmarshal(b, &name) == nil {
		if name == "" {
			return errors.New("a cluster name must not be empty")
		}
		*c = ClusterRef{Name: name}
		return nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil || len(m) != 1 {
		return errors.New(`a cluster is a name or {"<name>": {"resource_pool": "<pool>"}}`)
	}
	for k, v := range m {
		var o clusterOptions
		if len(v) > 0 && string(v) != "null" {
			if err := strict.JSON(k, v, &o); err != nil {
				return err
			}
		}
		if o.HostGroup != nil {
			return fmt.Errorf("%s.host_group is not supported: Runway places VMs with DRS on the whole cluster (or a resource pool)", k)
		}
		if len(o.DRSRules) > 0 {
			return fmt.Errorf("%s.drs_rules is not supported: use enable_auto_anti_affinity_drs_rules or vm_group", k)
		}
		*c = ClusterRef{Name: k, ResourcePool: o.ResourcePool}
	}
	return nil
}

// MarshalJSON writes the official form.
func (c ClusterRef) MarshalJSON() ([]byte, error) {
	if c.ResourcePool == "" {
		return json.Marshal(c.Name)
	}
	return json.Marshal(map[string]any{c.Name: map[string]string{"resource_pool": c.ResourcePool}})
}

// Defaults, as the official job.
const (
	defaultVMFolder       = "BOSH_VMs"
	defaultTemplateFolder = "BOSH_Templates"
	defaultDiskPath       = "BOSH_Disks"
	defaultHWVersion      = 17
	defaultRequestTimeout = 2 * time.Minute
)

func init() {
	driver.Register(driver.Registration{Section: config.Section{Name: "vsphere", Config: &Config{}, ContextKeys: contextKeys, Aliases: aliases},
		New: func(section json.RawMessage, deps driver.Deps) (driver.Driver, error) {
			return New(section, deps)
		},
	})
}

// contextKeys: what a cpi-config may set — as the official CPI merges a
// request's context into its vCenter: the vCenter, its account, the
// datacenter and the defaults for VMs and disks. session_cache (the
// host's state dir) configures the host.
var contextKeys = []string{"host", "user", "password", "datacenters", "connection_options", "insecure",
	"default_disk_type", "default_scsi_controller_type", "enable_auto_anti_affinity_drs_rules",
	"memory_reservation_locked_to_max", "upgrade_hw_version", "default_hw_version", "ensure_no_ip_conflicts",
	"vmx_options", "poll_max_ms", "wait_timeout_seconds", "request_timeout_seconds"}

// aliases are the official job's keys that are not Runway's own:
// vcenters (spread into the section), address, and what Runway refuses.
var aliases = []config.Alias{
	{Key: "vcenters", Apply: vcenters},
	config.Rename("address", "host"),
	config.Refuse("nsx", "NSX-V is not supported: Runway attaches VMs to port groups only (docs/vsphere.md)", isNil),
	config.Refuse("nsxt", "NSX-T is not supported: Runway attaches VMs to port groups only (docs/vsphere.md)", isNil),
	config.Refuse("plugins", "the official CPI's Ruby plugins do not run in Runway: use hooks (docs/hooks.md)", isEmpty),
	config.Refuse("enable_human_readable_name", "VMs are named vm-<uuid>, which has_vm and delete_vm find them by", config.IsFalse),
	config.Refuse("cpu_reserve_full_mhz", "Runway reserves no CPU", config.IsFalse),
	config.Refuse("http_logging", "Runway never logs vCenter's request bodies (they carry the session); each call's method is logged at debug", config.IsFalse),
	config.Refuse("vm_storage_policy_name", "storage policies (PBM) are not supported: name datastores with datastore_pattern", isNil),
}

func isNil(v any) bool { return v == nil }

func isEmpty(v any) bool {
	m, ok := v.(map[string]any)
	return v == nil || ok && len(m) == 0
}

// vcenters spreads the official list's one vCenter into the section.
func vcenters(v any, set func(string, any)) error {
	list, ok := v.([]any)
	if !ok || len(list) != 1 {
		return errors.New("vcenters must list exactly one vCenter (the official CPI supports a single vCenter)")
	}
	m, ok := list[0].(map[string]any)
	if !ok {
		return errors.New("vcenters[0] must be an object")
	}
	for k, x := range m {
		set(k, x)
	}
	return nil
}

func parseConfig(section json.RawMessage) (Config, error) {
	var c Config
	if err := driver.DecodeConfig("vsphere", section, &c); err != nil {
		return c, err
	}
	return c, c.validate()
}

func (c *Config) validate() error {
	if c.Host == "" {
		return errors.New("vsphere: host is required")
	}
	if strings.ContainsAny(c.Host, "/?#@ ") {
		return fmt.Errorf("vsphere: host %q must be a host name or address, optionally with :port", c.Host)
	}
	if c.User == "" || c.Password == "" {
		return errors.New("vsphere: user and password are required")
	}
	if len(c.Datacenters) != 1 {
		return fmt.Errorf("vsphere: datacenters must list exactly one datacenter, not %d (the official CPI supports a single datacenter)", len(c.Datacenters))
	}
	if err := c.Datacenters[0].validate(); err != nil {
		return err
	}
	switch c.DefaultDiskType {
	case "":
		c.DefaultDiskType = "preallocated"
	case "thin", "preallocated":
	default:
		return fmt.Errorf("vsphere: default_disk_type %q: want thin or preallocated", c.DefaultDiskType)
	}
	switch c.DefaultSCSIControllerType {
	case "":
		c.DefaultSCSIControllerType = "paravirtual"
	case "paravirtual", "lsi_logic", "lsi_logic_sas":
	default:
		return fmt.Errorf("vsphere: default_scsi_controller_type %q: want paravirtual, lsi_logic or lsi_logic_sas", c.DefaultSCSIControllerType)
	}
	if c.DefaultHWVersion == 0 {
		c.DefaultHWVersion = defaultHWVersion
	}
	if c.DefaultHWVersion < 4 || c.DefaultHWVersion > 99 {
		return fmt.Errorf("vsphere: default_hw_version %d is not a virtual hardware version", c.DefaultHWVersion)
	}
	if err := checkVMX("vmx_options", c.VMXOptions); err != nil {
		return err
	}
	for name, v := range map[string]int{"poll_max_ms": c.PollMaxMilli, "wait_timeout_seconds": c.WaitTimeoutSeconds,
		"request_timeout_seconds": c.RequestTimeoutSeconds} {
		if v < 0 {
			return fmt.Errorf("vsphere: %s must not be negative", name)
		}
	}
	if c.ConnectionOptions.CACert != "" {
		if _, err := c.rootCAs(); err != nil {
			return err
		}
	}
	return nil
}

func (dc *Datacenter) validate() error {
	p := "vsphere: datacenters[0]."
	if dc.Name == "" {
		return errors.New(p + "name is required")
	}
	switch {
	case dc.DatastoreClusterPattern != "":
		return errors.New(p + "datastore_cluster_pattern is not supported: Runway does not use Storage DRS datastore clusters; name datastores with datastore_pattern")
	case dc.PersistentDatastoreClusterPattern != "":
		return errors.New(p + "persistent_datastore_cluster_pattern is not supported: Runway does not use Storage DRS datastore clusters; name datastores with persistent_datastore_pattern")
	case dc.UseSubFolder:
		return errors.New(p + "use_sub_folder is not supported: VMs go into vm_folder itself")
	case dc.DatastorePattern == "":
		return errors.New(p + "datastore_pattern is required")
	case dc.PersistentDatastorePattern == "":
		return errors.New(p + "persistent_datastore_pattern is required")
	case len(dc.Clusters) == 0:
		return errors.New(p + "clusters must name at least one cluster")
	}
	for k, v := range map[string]string{"datastore_pattern": dc.DatastorePattern, "persistent_datastore_pattern": dc.PersistentDatastorePattern} {
		if _, err := compilePattern(v); err != nil {
			return fmt.Errorf("%s%s: %w", p, k, err)
		}
	}
	for k, v := range map[string]*string{"vm_folder": &dc.VMFolder, "template_folder": &dc.TemplateFolder, "disk_path": &dc.DiskPath} {
		if *v == "" {
			*v = map[string]string{"vm_folder": defaultVMFolder, "template_folder": defaultTemplateFolder, "disk_path": defaultDiskPath}[k]
		}
		if !safeFolder(*v) {
			return fmt.Errorf("%s%s %q must be a relative path of names (no '..', '[' or ']')", p, k, *v)
		}
	}
	return nil
}

// safeFolder: an inventory or datastore path relative to its root.
func safeFolder(s string) bool {
	if strings.HasPrefix(s, "/") || strings.ContainsAny(s, "[]\\\x00") {
		return false
	}
	for _, part := range strings.Split(s, "/") {
		if part == "" || part == "." || part == ".." {
			return false
		}
	}
	return true
}

// compilePattern reads an official datastore pattern. Ruby's \A and \z
// anchors (the official docs' examples) mean ^ and $ in Go.
func compilePattern(p string) (*regexp.Regexp, error) {
	p = strings.NewReplacer(`\A`, `^`, `\z`, `$`, `\Z`, `$`).Replace(p)
	return regexp.Compile(p)
}

// checkVMX refuses extraConfig values vCenter cannot take.
func checkVMX(what string, m map[string]any) error {
	for k, v := range m {
		if k == "" {
			return fmt.Errorf("%s: an empty key", what)
		}
		switch v.(type) {
		case string, float64, bool, json.Number:
		default:
			return fmt.Errorf("%s.%s must be a string, number or boolean", what, k)
		}
	}
	return nil
}

func (c Config) ensureNoIPConflicts() bool {
	return c.EnsureNoIPConflicts == nil || *c.EnsureNoIPConflicts
}

func (c Config) sessionCache() bool { return c.SessionCache == nil || *c.SessionCache }

func (c Config) dc() Datacenter { return c.Datacenters[0] }

// sdkURL is vCenter's SOAP endpoint.
func (c Config) sdkURL() *url.URL {
	return &url.URL{Scheme: "https", Host: c.Host, Path: "/sdk"}
}

// hostName is the host without its port (for messages and TLS).
func (c Config) hostName() string {
	if h, _, err := net.SplitHostPort(c.Host); err == nil {
		return h
	}
	return c.Host
}

func (c Config) requestTimeout() time.Duration {
	if c.RequestTimeoutSeconds > 0 {
		return time.Duration(c.RequestTimeoutSeconds) * time.Second
	}
	return defaultRequestTimeout
}

func (c Config) rootCAs() (*x509.CertPool, error) {
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM([]byte(c.ConnectionOptions.CACert)) {
		return nil, errors.New("vsphere: connection_options.ca_cert holds no PEM certificate")
	}
	return pool, nil
}

// tlsConfig trusts connection_options.ca_cert on top of the system's roots.
func (c Config) tlsConfig() (*tls.Config, error) {
	t := &tls.Config{MinVersion: tls.VersionTLS12, InsecureSkipVerify: c.Insecure} //nolint:gosec // opt-in, documented
	if c.ConnectionOptions.CACert != "" {
		pool, err := c.rootCAs()
		if err != nil {
			return nil, err
		}
		t.RootCAs = pool
	}
	return t, nil
}
