package openstack

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/poll"
)

// Config is the "openstack" section of the CPI config.
type Config struct {
	// AuthURL is Keystone's v3 endpoint (…/v3; a bare host:port gets /v3).
	AuthURL string `json:"auth_url"`
	Region  string `json:"region,omitempty"`
	// Interface selects catalog endpoints: public (default), internal, admin.
	Interface string `json:"interface,omitempty"`

	// Password auth: a user (by name in a domain, or by id) and a project.
	Username       string `json:"username,omitempty"`
	UserID         string `json:"user_id,omitempty"`
	Password       string `json:"password,omitempty"`
	UserDomainName string `json:"user_domain_name,omitempty"`
	UserDomainID   string `json:"user_domain_id,omitempty"`
	// Application credentials (project-scoped by Keystone; no project keys).
	ApplicationCredentialID     string `json:"application_credential_id,omitempty"`
	ApplicationCredentialName   string `json:"application_credential_name,omitempty"`
	ApplicationCredentialSecret string `json:"application_credential_secret,omitempty"`

	ProjectName       string `json:"project_name,omitempty"`
	ProjectID         string `json:"project_id,omitempty"`
	ProjectDomainName string `json:"project_domain_name,omitempty"`
	ProjectDomainID   string `json:"project_domain_id,omitempty"`
	// DomainName is the default for user and project domain names.
	DomainName string `json:"domain_name,omitempty"`

	// CACert is a PEM bundle (content) trusted in addition to the system's;
	// CAFile is the same, read from a file.
	CACert   string `json:"ca_cert,omitempty"`
	CAFile   string `json:"ca_file,omitempty"`
	Insecure bool   `json:"insecure,omitempty"`

	DefaultKeyName        string   `json:"default_key_name,omitempty"`
	DefaultSecurityGroups []string `json:"default_security_groups,omitempty"`
	DefaultVolumeType     string   `json:"default_volume_type,omitempty"`
	// BootFromVolume boots every VM from a new volume (per-VM cloud
	// properties override it).
	BootFromVolume bool `json:"boot_from_volume,omitempty"`
	// ConfigDrive: true, or the official CPI's "cdrom" or "disk" (a disk
	// config drive takes a device letter before the persistent disks).
	ConfigDrive ConfigDrive `json:"config_drive,omitempty"`
	// HumanReadableVMNames names servers after their job/index metadata.
	HumanReadableVMNames bool `json:"human_readable_vm_names,omitempty"`
	// IgnoreServerAvailabilityZone: create_disk leaves the zone to
	// Cinder's default instead of the VM's zone.
	IgnoreServerAvailabilityZone bool `json:"ignore_server_availability_zone,omitempty"`
	// UseDHCP is written into every non-vip network of the agent
	// settings (default true, as the official CPI).
	UseDHCP *bool `json:"use_dhcp,omitempty"`
	// StemcellPublicVisibility makes uploaded stemcell images public.
	StemcellPublicVisibility bool `json:"stemcell_public_visibility,omitempty"`

	// poll_max_ms and wait_timeout_seconds.
	poll.Polling
	// RequestTimeoutSeconds bounds each HTTP request (default 60).
	RequestTimeoutSeconds int `json:"request_timeout_seconds,omitempty"`
	// TokenCache keeps the Keystone token in the state dir for the next
	// bin/cpi process (default true).
	TokenCache *bool `json:"token_cache,omitempty"`
}

const (
	DefaultRequestTimeout = time.Minute
	firstPoll             = 250 * time.Millisecond
)

// ConfigDrive is true/false or "cdrom"/"disk".
type ConfigDrive string

// UnmarshalJSON takes a boolean or the official CPI's device kinds.
func (c *ConfigDrive) UnmarshalJSON(b []byte) error {
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	switch v {
	case true:
		*c = "cdrom"
	case false, nil:
		*c = ""
	case "cdrom", "disk":
		*c = ConfigDrive(v.(string))
	default:
		return fmt.Errorf("config_drive must be cdrom, disk, true or false, not %s", b)
	}
	return nil
}

// Enabled reports whether servers get a config drive.
func (c ConfigDrive) Enabled() bool { return c != "" }

func init() {
	driver.Register(driver.Registration{Section: config.Section{Name: "openstack", Config: &Config{}, ContextKeys: contextKeys, Aliases: aliases},
		New: func(section json.RawMessage, deps driver.Deps) (driver.Driver, error) {
			return New(section, deps)
		},
	})
}

// contextKeys: what a cpi-config may set — the account, its endpoints and
// the defaults for VMs, disks and stemcells. ca_file (a host path) and
// token_cache (the host's state dir) configure the host.
var contextKeys = []string{"auth_url", "region", "interface", "username", "user_id", "password", "user_domain_name",
	"user_domain_id", "application_credential_id", "application_credential_name", "application_credential_secret",
	"project_name", "project_id", "project_domain_name", "project_domain_id", "domain_name", "ca_cert", "insecure",
	"default_key_name", "default_security_groups", "default_volume_type", "boot_from_volume", "config_drive",
	"human_readable_vm_names", "ignore_server_availability_zone", "use_dhcp", "stemcell_public_visibility",
	"poll_max_ms", "wait_timeout_seconds", "request_timeout_seconds"}

// aliases are the official OpenStack CPI's job properties (openstack.*),
// by their names and units (docs/openstack.md has the table).
var aliases = []config.Alias{
	config.Rename("api_key", "password"),
	config.Rename("tenant", "project_name"),
	config.Rename("project", "project_name"),
	config.Rename("domain", "domain_name"),
	config.Rename("state_timeout", "wait_timeout_seconds"),
	config.Alias{Key: "endpoint_type", Apply: endpointType},
	config.Alias{Key: "wait_resource_poll_interval", Apply: func(v any, set func(string, any)) error {
		s, ok := v.(float64)
		if !ok || s <= 0 {
			return fmt.Errorf("wait_resource_poll_interval must be a positive number of seconds, not %v", v)
		}
		set("poll_max_ms", int(s*1000))
		return nil
	}},
	config.Alias{Key: "connection_options", Apply: connectionOptions},
	config.Refuse("use_nova_networking", "nova-network was removed from OpenStack (Rocky); Runway speaks Neutron", config.IsFalse),
	config.Refuse("enable_auto_anti_affinity", "the official CPI refuses it too; use scheduler_hints.group", nil),
}

// endpointType maps publicURL/internalURL/adminURL (Keystone v2 names,
// which the official CPI takes) onto interface.
func endpointType(v any, set func(string, any)) error {
	s, _ := v.(string)
	switch i := strings.TrimSuffix(s, "URL"); i {
	case "public", "internal", "admin":
		set("interface", i)
		return nil
	}
	return fmt.Errorf("endpoint_type %v: want publicURL, internalURL or adminURL", v)
}

// connectionOptions takes the official CPI's excon options that mean
// something to an HTTP client: ca_cert, ssl_verify_peer and the timeouts
// (the longest bounds each request).
func connectionOptions(v any, set func(string, any)) error {
	m, ok := v.(map[string]any)
	if !ok {
		return fmt.Errorf("connection_options must be an object")
	}
	timeout := 0.0
	for k, x := range m {
		switch k {
		case "ca_cert":
			if s, ok := x.(string); ok && s != "" {
				set("ca_cert", s)
			}
		case "ssl_verify_peer":
			b, ok := x.(bool)
			if !ok {
				return fmt.Errorf("connection_options.ssl_verify_peer must be a boolean")
			}
			set("insecure", !b)
		case "connect_timeout", "read_timeout", "write_timeout":
			n, ok := x.(float64)
			if !ok || n <= 0 {
				return fmt.Errorf("connection_options.%s must be a positive number of seconds", k)
			}
			timeout = max(timeout, n)
		default:
			return fmt.Errorf("connection_options.%s is not supported (Runway takes ca_cert, ssl_verify_peer, connect_timeout, read_timeout and write_timeout)", k)
		}
	}
	if timeout > 0 {
		set("request_timeout_seconds", int(timeout+0.999))
	}
	return nil
}

func parseConfig(section json.RawMessage) (Config, error) {
	var c Config
	if err := driver.DecodeConfig("openstack", section, &c); err != nil {
		return c, err
	}
	if c.AuthURL == "" {
		return c, errors.New("openstack: auth_url is required")
	}
	u, err := url.Parse(c.AuthURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return c, fmt.Errorf("openstack: auth_url %q must be an http(s) URL", c.AuthURL)
	}
	c.AuthURL = strings.TrimRight(c.AuthURL, "/")
	if !strings.HasSuffix(c.AuthURL, "/v3") {
		if strings.HasSuffix(c.AuthURL, "/v2.0") {
			return c, fmt.Errorf("openstack: auth_url %q is Keystone v2.0, which Keystone removed in Queens; Runway speaks v3 (use …/v3 with project and domain)", c.AuthURL)
		}
		c.AuthURL += "/v3"
	}
	switch c.Interface {
	case "":
		c.Interface = "public"
	case "public", "internal", "admin":
	default:
		return c, fmt.Errorf("openstack: interface %q: want public, internal or admin", c.Interface)
	}
	appCred := c.ApplicationCredentialID != "" || c.ApplicationCredentialName != ""
	switch {
	case appCred:
		if c.ApplicationCredentialSecret == "" {
			return c, errors.New("openstack: application_credential_secret is required with an application credential")
		}
		if c.ApplicationCredentialID == "" && c.Username == "" && c.UserID == "" {
			return c, errors.New("openstack: application_credential_name needs username (with a domain) or user_id")
		}
		if c.ProjectName != "" || c.ProjectID != "" {
			return c, errors.New("openstack: an application credential is already scoped to its project; drop project_name/project_id")
		}
	default:
		if c.Username == "" && c.UserID == "" {
			return c, errors.New("openstack: username or user_id is required (or an application credential)")
		}
		if c.Password == "" {
			return c, errors.New("openstack: password is required")
		}
		if c.ProjectName == "" && c.ProjectID == "" {
			return c, errors.New("openstack: project_name or project_id is required")
		}
	}
	if c.Username != "" && c.UserDomainName == "" && c.UserDomainID == "" {
		c.UserDomainName = c.DomainName
		if c.UserDomainName == "" {
			c.UserDomainName = "Default"
		}
	}
	if c.ProjectName != "" && c.ProjectDomainName == "" && c.ProjectDomainID == "" {
		c.ProjectDomainName = c.DomainName
		if c.ProjectDomainName == "" {
			c.ProjectDomainName = "Default"
		}
	}
	if c.CACert != "" && c.CAFile != "" {
		return c, errors.New("openstack: set ca_cert or ca_file, not both")
	}
	for name, v := range map[string]int{"poll_max_ms": c.PollMaxMilli,
		"wait_timeout_seconds": c.WaitTimeoutSeconds, "request_timeout_seconds": c.RequestTimeoutSeconds} {
		if v < 0 {
			return c, fmt.Errorf("openstack: %s must not be negative", name)
		}
	}
	return c, nil
}

func (c Config) useDHCP() bool { return c.UseDHCP == nil || *c.UseDHCP }

func (c Config) tokenCache() bool { return c.TokenCache == nil || *c.TokenCache }

// httpClient trusts the configured CA bundle on top of the system pool.
func (c Config) httpClient() (http.Client, error) {
	timeout := DefaultRequestTimeout
	if c.RequestTimeoutSeconds > 0 {
		timeout = time.Duration(c.RequestTimeoutSeconds) * time.Second
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	pem := []byte(c.CACert)
	if c.CAFile != "" {
		b, err := os.ReadFile(c.CAFile)
		if err != nil {
			return http.Client{}, fmt.Errorf("openstack: ca_file: %w", err)
		}
		pem = b
	}
	if len(pem) > 0 || c.Insecure {
		tr.TLSClientConfig = &tls.Config{InsecureSkipVerify: c.Insecure} //nolint:gosec // opt-in, documented
		if len(pem) > 0 {
			pool, err := x509.SystemCertPool()
			if err != nil {
				pool = x509.NewCertPool()
			}
			if !pool.AppendCertsFromPEM(pem) {
				return http.Client{}, errors.New("openstack: ca_cert/ca_file holds no PEM certificate")
			}
			tr.TLSClientConfig.RootCAs = pool
		}
	}
	return http.Client{Transport: tr, Timeout: timeout}, nil
}
