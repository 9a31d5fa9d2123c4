// Package config is `runway serve`'s configuration: the YAML, decoded
// strictly, its defaults and its validation with field names.
package config

import (
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"regexp"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/strict/strictyaml"
)

// Config is `runway serve -config runway.yml`.
type Config struct {
	Listen   string        `yaml:"listen"`
	StateDir string        `yaml:"state_dir"`
	LogLevel string        `yaml:"log_level"`
	CPI      CPIConfig     `yaml:"cpi"`
	Forges   []ForgeConfig `yaml:"forges"`
	Groups   []GroupConfig `yaml:"groups"`
	// SweepInterval paces the slower checks: has_vm per runner, the
	// forge's runner list, offline registrations.
	SweepInterval Duration `yaml:"sweep_interval"`
	// History keeps deleted runners' rows this long.
	History Duration `yaml:"history"`
	// AdminTokenFile, when set, guards the write endpoints (drain, resume)
	// with `Authorization: Bearer <token>`.
	AdminTokenFile string `yaml:"admin_token_file"`
	// HTTP bounds what clients of the daemon's HTTP interface may hold.
	HTTP HTTPConfig `yaml:"http"`
	// Store is where the state lives: "sqlite" (the default: state_dir's
	// runway.db, one daemon) or "postgres" (shared by replicas, one of
	// which acts for each group at a time).
	Store    string         `yaml:"store"`
	Postgres PostgresConfig `yaml:"postgres"`
}

// PostgresConfig locates the database of `store: postgres`. The DSN is a
// secret (it may carry a password): from a file or the environment only.
type PostgresConfig struct {
	DSNFile string `yaml:"dsn_file"`
	DSNEnv  string `yaml:"dsn_env"`
}

// HTTPConfig: timeouts and a cap on concurrent connections, so slow or
// many clients (the webhook port faces the forge) cannot exhaust the
// daemon.
type HTTPConfig struct {
	MaxConnections int `yaml:"max_connections"`
	// MaxConnectionsPerClient: beyond this many connections from one
	// address (IPv6: one /64), the ones keeping the server waiting are
	// closed.
	MaxConnectionsPerClient int      `yaml:"max_connections_per_client"`
	ReadHeaderTimeout       Duration `yaml:"read_header_timeout"`
	// ReadBodyTimeout bounds a request's body, from its headers' end.
	ReadBodyTimeout Duration `yaml:"read_body_timeout"`
	ReadTimeout     Duration `yaml:"read_timeout"`
	WriteTimeout    Duration `yaml:"write_timeout"`
	IdleTimeout     Duration `yaml:"idle_timeout"`
}

// CPIConfig is how bin/cpi is called.
type CPIConfig struct {
	Path    string   `yaml:"path"`
	Config  string   `yaml:"config"`
	Timeout Duration `yaml:"timeout"`
	// DirectorUUID goes into every request's context and so onto every
	// VM as its `director` tag: it is how this orchestrator finds its own.
	DirectorUUID       string `yaml:"director_uuid"`
	StemcellAPIVersion int    `yaml:"stemcell_api_version"`
}

// ForgeConfig is one Gitea or GitHub.
type ForgeConfig struct {
	Name string `yaml:"name"`
	Type string `yaml:"type"` // gitea | forgejo | github
	URL  string `yaml:"url"`  // Gitea instance URL; GitHub API URL
	// RunnerURL is the URL a runner connects to (default: url; GitHub:
	// https://github.com).
	RunnerURL         string   `yaml:"runner_url"`
	TokenFile         string   `yaml:"token_file"`
	TokenEnv          string   `yaml:"token_env"`
	WebhookSecretFile string   `yaml:"webhook_secret_file"`
	WebhookSecretEnv  string   `yaml:"webhook_secret_env"`
	PollInterval      Duration `yaml:"poll_interval"`
	RunnerGroupID     int64    `yaml:"runner_group_id"` // GitHub JIT
	// App authenticates to GitHub as an App installation (in place of
	// token_file / token_env).
	App AppConfig `yaml:"app"`
	// Secrets gives the token and webhook secret from memory instead of
	// a file or the environment: a config source other than the file
	// (Kubernetes Secrets) sets it, and keeps it current itself.
	Secrets SecretSource `yaml:"-"`
	// Guard, when set, refuses the addresses the forge's requests may
	// not reach (the Kubernetes controller's forges: their URLs are their
	// authors').
	Guard AddressGuard `yaml:"-"`
}

// AddressGuard says why a forge may not be reached at an address.
type AddressGuard interface {
	Check(addr netip.Addr) error
}

// AppConfig is a GitHub App installation Runway authenticates as: the
// App's id (or client id), the installation's id, and where the App's
// private key (PEM) is read from.
type AppConfig struct {
	ID             string `yaml:"id"`
	InstallationID int64  `yaml:"installation_id"`
	PrivateKeyFile string `yaml:"private_key_file"`
	PrivateKeyEnv  string `yaml:"private_key_env"`
}

// Set reports whether any of the App's keys is set.
func (a AppConfig) Set() bool { return a != AppConfig{} }

// SecretSource is a forge's token and webhook secret held in memory,
// read at every use (a rotated value needs no other call).
type SecretSource interface {
	Token() string
	WebhookSecret() string
}

// AppSource is a SecretSource that may hold a GitHub App installation's
// credentials in place of a token (ARC's githubConfigSecret:
// github_app_id, github_app_installation_id, github_app_private_key).
// An empty id: it holds a token.
type AppSource interface {
	SecretSource
	App() (id string, installation int64, privateKey string)
}

// GroupConfig is one pool of runners (seed 001's RunnerGroup).
type GroupConfig struct {
	Name             string         `yaml:"name"`
	Forge            string         `yaml:"forge"`
	Scope            string         `yaml:"scope"`
	Org              string         `yaml:"org"`
	User             string         `yaml:"user"`
	Repo             string         `yaml:"repo"` // owner/name
	Enterprise       string         `yaml:"enterprise"`
	Labels           []string       `yaml:"labels"`
	MaxActiveRunners int            `yaml:"max_active_runners"`
	MinIdle          int            `yaml:"min_idle"`
	Stemcell         StemcellConfig `yaml:"stemcell"`
	CloudProperties  map[string]any `yaml:"cloud_properties"`
	Networks         map[string]any `yaml:"networks"`
	Runner           RunnerConfig   `yaml:"runner"`
	Timeouts         Timeouts       `yaml:"timeouts"`
	PollInterval     Duration       `yaml:"poll_interval"`
	// SpawnConcurrency bounds parallel create_vm calls for this group.
	SpawnConcurrency int `yaml:"spawn_concurrency"`
	// CPI overrides the top-level cpi keys for this group (another IaaS,
	// another CPI config).
	CPI GroupCPI `yaml:"cpi"`
	// Priority decides which group claims a job two groups could run
	// equally well (same scope specificity, as many labels): the higher
	// one; equal priorities go by name.
	Priority int `yaml:"priority"`
	// Demand is where the group learns of its jobs: "forge" (the
	// default: the forge's job listing, polled, kept current by webhooks)
	// or "scale_set" (GitHub: a runner scale set's message session,
	// long-polled; no webhook, no listing).
	Demand   string         `yaml:"demand"`
	ScaleSet ScaleSetConfig `yaml:"scale_set"`
	// Retire asks the engine to remove the group's runners, their VMs and
	// their registrations, and make no more (a config source deleting the
	// group; GroupStatus.Retired says when it is done).
	Retire bool `yaml:"-"`
}

// Demand sources.
const (
	DemandForge    = "forge"
	DemandScaleSet = "scale_set"
)

// ScaleSetConfig names a scale-set group's runner scale set.
type ScaleSetConfig struct {
	// Name of the scale set (default: the group's name).
	Name string `yaml:"name"`
	// RunnerGroupID: the runner group it belongs to (default: the
	// forge's runner_group_id).
	RunnerGroupID int64 `yaml:"runner_group_id"`
}

// GroupCPI is the part of CPIConfig a group may override.
type GroupCPI struct {
	Path    string   `yaml:"path"`
	Config  string   `yaml:"config"`
	Timeout Duration `yaml:"timeout"`
}

// EffectiveCPI is the group's CPI: top with the group's overrides.
func (g GroupConfig) EffectiveCPI(top CPIConfig) CPIConfig {
	c := top
	if g.CPI.Path != "" {
		c.Path = g.CPI.Path
	}
	if g.CPI.Config != "" {
		c.Config = g.CPI.Config
	}
	if g.CPI.Timeout.Duration != 0 {
		c.Timeout = g.CPI.Timeout
	}
	return c
}

// StemcellConfig names the image: an existing CID, or a tarball uploaded
// once (create_stemcell) and remembered in the state store.
type StemcellConfig struct {
	CID             string         `yaml:"cid"`
	Image           string         `yaml:"image"`
	CloudProperties map[string]any `yaml:"cloud_properties"`
}

// RunnerConfig is what the VM runs.
type RunnerConfig struct {
	Command string            `yaml:"command"` // the runner binary or bootstrap, on the VM
	Args    []string          `yaml:"args"`
	Env     map[string]string `yaml:"env"`
}

// Timeouts bound a runner's life.
type Timeouts struct {
	Spawn       Duration `yaml:"spawn"`        // create_vm to registered
	Idle        Duration `yaml:"idle"`         // created, no job taken
	MaxLifetime Duration `yaml:"max_lifetime"` // whatever it is doing
	// Pickup: a runner online this long that took none of the group's
	// jobs queued as long is not taking jobs.
	Pickup Duration `yaml:"pickup"`
}

// Duration reads "90s", "15m", "2h".
type Duration struct{ time.Duration }

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	var s string
	if err := n.Decode(&s); err != nil {
		return errors.New(`must be a duration like "30s" or "10m"`)
	}
	v, err := time.ParseDuration(s)
	if err != nil || v < 0 {
		return fmt.Errorf(`%q is not a duration like "30s" or "10m"`, s)
	}
	d.Duration = v
	return nil
}

// MarshalYAML implements yaml.Marshaler.
func (d Duration) MarshalYAML() (any, error) { return d.String(), nil }

// FieldError names the offending field by its whole path (Field:
// groups[2].labels). One forge's or group's field also has List
// ("forges" or "groups") and Index, its place in the list handed over:
// a source handing over a set reads which of its objects is at fault
// (errors.As), not the message.
type FieldError struct {
	Field, Msg string
	List       string
	Index      int
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// InItem is the field's path within its forge or group (labels[0]); Field
// when it is no item's.
func (e *FieldError) InItem() string {
	if e.List == "" {
		return e.Field
	}
	return strings.TrimPrefix(e.Field, fmt.Sprintf("%s[%d].", e.List, e.Index))
}

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,38}$`)

// LoadConfig reads, defaults and validates a config file.
func LoadConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	c, err := ParseConfig(b)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return c, nil
}

// ParseConfig decodes strictly (unknown keys are errors), fills defaults
// and validates.
func ParseConfig(b []byte) (*Config, error) {
	var c Config
	if err := strictyaml.Decode("", b, &c); err != nil {
		return nil, err
	}
	c.defaults()
	if err := c.validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// LoadControllerConfig reads the config of `runway controller`, whose
// forges and groups come from Kubernetes resources: the daemon's keys,
// with forges and groups allowed to be empty.
func LoadControllerConfig(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	var c Config
	if err := strictyaml.Decode("", b, &c); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	c.defaults()
	var errs fieldErrors
	c.validateDaemon(&errs)
	validateSet(&errs, c.Forges, c.Groups)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return &c, nil
}

func def(d *Duration, v time.Duration) {
	if d.Duration == 0 {
		d.Duration = v
	}
}

func (c *Config) defaults() {
	if c.Listen == "" {
		c.Listen = "127.0.0.1:8480"
	}
	if c.LogLevel == "" {
		c.LogLevel = "info"
	}
	if c.Store == "" {
		c.Store = "sqlite"
	}
	def(&c.SweepInterval, 30*time.Second)
	if c.HTTP.MaxConnections == 0 {
		c.HTTP.MaxConnections = 256
	}
	if c.HTTP.MaxConnectionsPerClient == 0 {
		c.HTTP.MaxConnectionsPerClient = max(c.HTTP.MaxConnections/4, 1)
	}
	def(&c.HTTP.ReadHeaderTimeout, 10*time.Second)
	def(&c.HTTP.ReadBodyTimeout, 10*time.Second)
	def(&c.HTTP.ReadTimeout, 30*time.Second)
	def(&c.HTTP.WriteTimeout, time.Minute)
	def(&c.HTTP.IdleTimeout, 2*time.Minute)
	def(&c.History, 24*time.Hour)
	def(&c.CPI.Timeout, 10*time.Minute)
	if c.CPI.DirectorUUID == "" {
		c.CPI.DirectorUUID = "runway-orchestrator"
	}
	if c.CPI.StemcellAPIVersion == 0 {
		c.CPI.StemcellAPIVersion = 2
	}
	defaultSet(c.Forges, c.Groups)
}

// gitHubRunnerURL is the GitHub a REST API URL belongs to: github.com
// for api.github.com, NAME.ghe.com for api.NAME.ghe.com (GHE.com's data
// residency), and for GHES's https://HOST/api/v3 the host itself.
func gitHubRunnerURL(api string) string {
	u, err := url.Parse(api)
	if err != nil || u.Host == "" {
		return "https://github.com"
	}
	host := strings.ToLower(u.Host)
	switch {
	case host == "api.github.com":
		return "https://github.com"
	case strings.HasPrefix(host, "api.") && strings.HasSuffix(host, ".ghe.com"):
		return u.Scheme + "://" + strings.TrimPrefix(host, "api.")
	case strings.HasSuffix(strings.TrimRight(u.Path, "/"), "/api/v3"):
		return u.Scheme + "://" + u.Host + strings.TrimSuffix(strings.TrimRight(u.Path, "/"), "/api/v3")
	}
	return "https://github.com"
}

// defaultSet fills the forges' and groups' defaults.
func defaultSet(forges []ForgeConfig, groups []GroupConfig) {
	for i := range forges {
		f := &forges[i]
		if f.Type == "github" {
			def(&f.PollInterval, 5*time.Minute)
			if f.URL == "" {
				f.URL = "https://api.github.com"
			}
			if f.RunnerURL == "" {
				f.RunnerURL = gitHubRunnerURL(f.URL)
			}
			if f.RunnerGroupID == 0 {
				f.RunnerGroupID = 1
			}
		}
		def(&f.PollInterval, 15*time.Second)
		if f.RunnerURL == "" {
			f.RunnerURL = f.URL
		}
	}
	for i := range groups {
		g := &groups[i]
		if g.Forge == "" && len(forges) == 1 {
			g.Forge = forges[0].Name
		}
		def(&g.Timeouts.Spawn, 10*time.Minute)
		def(&g.Timeouts.Idle, 15*time.Minute)
		def(&g.Timeouts.MaxLifetime, 6*time.Hour)
		def(&g.Timeouts.Pickup, 2*time.Minute)
		if g.SpawnConcurrency == 0 {
			g.SpawnConcurrency = 4
		}
		if g.Demand == "" {
			g.Demand = DemandForge
		}
		if g.CloudProperties == nil {
			g.CloudProperties = map[string]any{}
		}
		if g.Networks == nil {
			g.Networks = map[string]any{}
		}
	}
}

// ForgeScope returns the group's forge scope.
func (g GroupConfig) ForgeScope() forge.Scope {
	switch g.Scope {
	case "org":
		return forge.Scope{Kind: "org", Owner: g.Org}
	case "user":
		return forge.Scope{Kind: "user", Owner: g.User}
	case "repo":
		o, n, _ := strings.Cut(g.Repo, "/")
		return forge.Scope{Kind: "repo", Owner: o, Repo: n}
	case "enterprise":
		return forge.Scope{Kind: "enterprise", Owner: g.Enterprise}
	}
	return forge.Scope{Kind: "global"}
}
