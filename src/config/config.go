// Package config loads and validates the CPI configuration file (JSON, as
// BOSH job templates render it). Every key but driver and state_dir has a
// documented default (docs/configuration.md).
package config

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/driver/catalog"
	"github.com/runway-cpi/runway/src/strict"
)

// Config is the whole file.
type Config struct {
	Driver             string `json:"driver"`
	StateDir           string `json:"state_dir"`
	LogLevel           string `json:"log_level,omitempty"`
	LockTimeoutSeconds int    `json:"lock_timeout_seconds,omitempty"`
	Retry              Retry  `json:"retry"`
	Agent              Agent  `json:"agent"`

	// Hooks and garm are owned by their packages.
	Hooks json.RawMessage `json:"hooks,omitempty"`
	Garm  json.RawMessage `json:"garm,omitempty"`

	// Sections are the drivers' own sections, by driver name, decoded by
	// the driver (any key that is not one of the above must name a
	// driver: typos surface at load time).
	Sections map[string]json.RawMessage `json:"-"`

	// Path the config was read from, for messages.
	Path string `json:"-"`
}

// Retry is the wait budget for rate limits and transient faults.
type Retry struct {
	WaitBudgetSeconds   int `json:"wait_budget_seconds,omitempty"`
	MaxBackoffSeconds   int `json:"max_backoff_seconds,omitempty"`
	InitialBackoffMilli int `json:"initial_backoff_ms,omitempty"`
}

// Agent holds what goes into agent settings besides per-VM data.
type Agent struct {
	Mbus      string         `json:"mbus,omitempty"`
	NTP       []string       `json:"ntp,omitempty"`
	Blobstore map[string]any `json:"blobstore,omitempty"`
}

// LogLevels are the levels log_level takes (any case), as the logger
// (src/logging) reads them; config checks them without loading it, so
// bin/cpi starts without the logger.
var LogLevels = []string{"debug", "info", "warn", "error", "none"}

// maxWaitSeconds bounds every configured wait: one day.
const maxWaitSeconds = 86400

// Defaults.
const (
	DefaultDriver            = "local"
	DefaultLogLevel          = "info"
	DefaultLockTimeout       = 120
	DefaultWaitBudgetSeconds = 600
	DefaultMaxBackoffSeconds = 30
	DefaultInitialBackoffMs  = 250
)

// Error names the file and the field at fault.
type Error struct {
	Path  string
	Field string
	Msg   string
}

func (e *Error) Error() string {
	where := "config"
	if e.Path != "" {
		where = "config " + e.Path
	}
	if e.Field != "" {
		return fmt.Sprintf("%s: %s: %s", where, e.Field, e.Msg)
	}
	return where + ": " + e.Msg
}

// Load reads and validates the file at path. Only a regular file is read:
// a FIFO or a device would block the call (or never end it).
func Load(path string) (*Config, error) {
	if st, err := os.Stat(path); err != nil {
		return nil, &Error{Path: path, Msg: fmt.Sprintf("cannot read: %v", PathErrCause(err))}
	} else if !st.Mode().IsRegular() {
		return nil, &Error{Path: path, Msg: fmt.Sprintf("is not a regular file (%s)", st.Mode().Type())}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{Path: path, Msg: fmt.Sprintf("cannot read: %v", PathErrCause(err))}
	}
	return Parse(data, path)
}

// Parse validates a config document.
func Parse(data []byte, path string) (*Config, error) {
	c := &Config{}
	if err := c.decode(data); err != nil {
		return nil, &Error{Path: path, Msg: err.Error()}
	}
	c.Path = path
	if err := c.finish(); err != nil {
		if ce, ok := err.(*Error); ok {
			ce.Path = path
		}
		return nil, err
	}
	return c, nil
}

// Embedded is the config used without -configPath: the local driver with a
// per-user state dir.
func Embedded() (*Config, error) {
	c := &Config{Driver: DefaultDriver, StateDir: DefaultStateDir(), Sections: map[string]json.RawMessage{}}
	return c, c.finish()
}

// DefaultStateDir is $RUNWAY_STATE_DIR, else ~/.runway/state, else a
// per-user directory under the temp dir.
func DefaultStateDir() string {
	if d := os.Getenv("RUNWAY_STATE_DIR"); d != "" {
		return d
	}
	if h := os.Getenv("HOME"); h != "" && filepath.IsAbs(h) {
		return filepath.Join(h, ".runway", "state")
	}
	return filepath.Join(os.TempDir(), "runway-"+strconv.Itoa(os.Getuid()))
}

// decode reads the core keys strictly and keeps each driver's section.
func (c *Config) decode(data []byte) error {
	var top map[string]json.RawMessage
	if err := DecodeStrict(data, &top); err != nil {
		return err
	}
	if top == nil {
		return errors.New("must be a JSON object, got null")
	}
	if cloud, ok := top["cloud"]; ok {
		if len(top) != 1 {
			return errors.New(`the official CPIs' shape {"cloud": {"plugin": …, "properties": …}} takes no other top-level key`)
		}
		return c.decodeOfficial(cloud)
	}
	core := map[string]json.RawMessage{}
	c.Sections = map[string]json.RawMessage{}
	coreKeys := jsonKeys(c)
	drivers := catalog.Names()
	for k, v := range top {
		switch {
		case slices.Contains(coreKeys, k):
			core[k] = v
		case slices.Contains(drivers, k):
			c.Sections[k] = v
		default:
			return strict.Unknown("", k, append(coreKeys, drivers...))
		}
	}
	b, err := json.Marshal(core)
	if err != nil {
		return err
	}
	return DecodeStrict(b, c)
}

// decodeOfficial reads the official CPIs' config file as their job
// templates render it: cloud.plugin names the driver, cloud.properties
// holds the driver's section under the plugin's name and the agent's
// settings. There is no state_dir in it: DefaultStateDir applies.
func (c *Config) decodeOfficial(raw json.RawMessage) error {
	var o struct {
		Plugin     string                     `json:"plugin"`
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := strict.JSON("cloud", raw, &o); err != nil {
		return err
	}
	if !slices.Contains(catalog.Names(), o.Plugin) {
		return fmt.Errorf("cloud.plugin: unknown plugin %q (one of %s)", o.Plugin, strings.Join(catalog.Names(), ", "))
	}
	c.Driver, c.StateDir = o.Plugin, DefaultStateDir()
	c.Sections = map[string]json.RawMessage{}
	row, _ := catalog.Lookup(o.Plugin)
	for k, v := range o.Properties {
		switch {
		case slices.Contains(row.OfficialKeys, k):
			// moved into the section after the loop, with stemcell.
		case k == o.Plugin:
			c.Sections[k] = v
		case k == "agent":
			if err := strict.JSON("cloud.properties.agent", v, &c.Agent); err != nil {
				return err
			}
		case k == "registry" || k == "debug":
			// The registry served pre-v2 stemcells (Runway hands agent
			// settings over directly); debug.cpi.api_version caps the
			// official CPI's API version, and Runway answers v3's
			// contract to every caller. Both are read and have no effect
			// (docs/configuration.md).
		case k == "stemcell":
			// aws: stemcell.kernel_id, refused by the aws section's check;
			// moved into the section after the loop (map order is random).
		default:
			return strict.Unknown("cloud.properties", k, append([]string{o.Plugin, "agent", "registry", "debug", "stemcell"}, row.OfficialKeys...))
		}
	}
	return c.moveIntoSection(o.Plugin, o.Properties, append([]string{"stemcell"}, row.OfficialKeys...))
}

// moveIntoSection puts the official properties named keys into the
// plugin's section, beside what it holds.
func (c *Config) moveIntoSection(plugin string, props map[string]json.RawMessage, keys []string) error {
	for _, k := range keys {
		if err := c.moveKey(plugin, k, props); err != nil {
			return err
		}
	}
	return nil
}

func (c *Config) moveKey(plugin, key string, props map[string]json.RawMessage) error {
	v, ok := props[key]
	if !ok {
		return nil
	}
	var section map[string]json.RawMessage
	if raw, ok := c.Sections[plugin]; ok {
		if err := json.Unmarshal(raw, &section); err != nil {
			return fmt.Errorf("cloud.properties.%s: must be an object: %w", plugin, err)
		}
	}
	if section == nil {
		section = map[string]json.RawMessage{}
	}
	section[key] = v
	b, err := json.Marshal(section)
	if err != nil {
		return fmt.Errorf("cloud.properties.%s: %w", key, err)
	}
	c.Sections[plugin] = b
	return nil
}

// jsonKeys lists the JSON keys of a struct's fields.
func jsonKeys(v any) []string {
	t := reflect.TypeOf(v).Elem()
	var out []string
	for i := 0; i < t.NumField(); i++ {
		if name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ","); name != "" && name != "-" {
			out = append(out, name)
		}
	}
	return out
}

func (c *Config) finish() error {
	drivers := catalog.Names()
	if c.Driver == "" {
		return &Error{Field: "driver", Msg: "is required (one of " + strings.Join(drivers, ", ") + ")"}
	}
	if !slices.Contains(drivers, c.Driver) {
		return &Error{Field: "driver", Msg: fmt.Sprintf("unknown driver %q (one of %s)", c.Driver, strings.Join(drivers, ", "))}
	}
	if c.StateDir == "" {
		return &Error{Field: "state_dir", Msg: "is required"}
	}
	if !filepath.IsAbs(c.StateDir) {
		return &Error{Field: "state_dir", Msg: fmt.Sprintf("must be an absolute path, got %q", c.StateDir)}
	}
	c.StateDir = filepath.Clean(c.StateDir)
	c.LogLevel = cmp.Or(c.LogLevel, DefaultLogLevel)
	if !slices.Contains(LogLevels, strings.ToLower(c.LogLevel)) {
		return &Error{Field: "log_level", Msg: fmt.Sprintf("%q: want one of %s", c.LogLevel, strings.Join(LogLevels, ", "))}
	}
	c.LockTimeoutSeconds = cmp.Or(c.LockTimeoutSeconds, DefaultLockTimeout)
	// Bounds keep a typo from turning into an endless wait (a count of
	// seconds past ~292 years overflows a duration into a negative one).
	if c.LockTimeoutSeconds < 0 || c.LockTimeoutSeconds > maxWaitSeconds {
		return &Error{Field: "lock_timeout_seconds", Msg: fmt.Sprintf("%d: must be 1 to %d (a day)", c.LockTimeoutSeconds, maxWaitSeconds)}
	}
	r := &c.Retry
	r.WaitBudgetSeconds = cmp.Or(r.WaitBudgetSeconds, DefaultWaitBudgetSeconds)
	r.MaxBackoffSeconds = cmp.Or(r.MaxBackoffSeconds, DefaultMaxBackoffSeconds)
	r.InitialBackoffMilli = cmp.Or(r.InitialBackoffMilli, DefaultInitialBackoffMs)
	for _, f := range []struct {
		name     string
		v, limit int
	}{{"retry.wait_budget_seconds", r.WaitBudgetSeconds, maxWaitSeconds}, {"retry.max_backoff_seconds", r.MaxBackoffSeconds, maxWaitSeconds},
		{"retry.initial_backoff_ms", r.InitialBackoffMilli, maxWaitSeconds * 1000}} {
		if f.v < 0 || f.v > f.limit {
			return &Error{Field: f.name, Msg: fmt.Sprintf("%d: must be 1 to %d", f.v, f.limit)}
		}
	}
	return nil
}

// HasHooks reports whether a hooks section is configured.
func (c *Config) HasHooks() bool {
	h := bytes.TrimSpace(c.Hooks)
	return len(h) > 0 && !bytes.Equal(h, []byte("null"))
}

// LockTimeout as a duration.
func (c *Config) LockTimeout() time.Duration {
	return time.Duration(c.LockTimeoutSeconds) * time.Second
}

// DriverSection returns the raw section of the selected driver ("{}" when
// absent).
func (c *Config) DriverSection() json.RawMessage {
	s := c.Sections[c.Driver]
	if len(bytes.TrimSpace(s)) == 0 || string(bytes.TrimSpace(s)) == "null" {
		return json.RawMessage("{}")
	}
	return s
}

// DecodeStrict decodes one JSON object strictly (src/strict): unknown
// keys, wrong kinds and trailing data are errors naming the field.
func DecodeStrict(data []byte, v any) error {
	return strict.JSON("", data, v)
}

// PathErrCause is a failed file operation's cause without the operation
// and path, for a message that names the path itself.
func PathErrCause(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
