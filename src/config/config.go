// Package config loads and validates the CPI configuration file (JSON, as
// BOSH job templates render it). Every key but driver and state_dir has a
// documented default (docs/configuration.md).
package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/formats"
	"github.com/runway-cpi/runway/src/logging"
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

// Load reads and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, &Error{Path: path, Msg: fmt.Sprintf("cannot read: %v", unwrapPathErr(err))}
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
	drivers := formats.Drivers
	for k, v := range top {
		switch {
		case slices.Contains(coreKeys, k):
			core[k] = v
		case slices.Contains(drivers, k):
			c.Sections[k] = v
		default:
			msg := fmt.Sprintf("unknown field %q", k)
			if best := driver.Closest(k, append(coreKeys, drivers...)); best != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", best)
			} else {
				msg += " (neither a config key nor a driver: " + strings.Join(drivers, ", ") + ")"
			}
			return errors.New(msg)
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
	if err := DecodeStrict(raw, &o); err != nil {
		return fmt.Errorf("cloud: %w", err)
	}
	if !slices.Contains(formats.Drivers, o.Plugin) {
		return fmt.Errorf("cloud.plugin: unknown plugin %q (one of %s)", o.Plugin, strings.Join(formats.Drivers, ", "))
	}
	c.Driver, c.StateDir = o.Plugin, DefaultStateDir()
	c.Sections = map[string]json.RawMessage{}
	for k, v := range o.Properties {
		switch k {
		case o.Plugin:
			c.Sections[k] = v
		case "agent":
			if err := DecodeStrict(v, &c.Agent); err != nil {
				return fmt.Errorf("cloud.properties.agent: %w", err)
			}
		case "registry", "debug":
			// The registry served pre-v2 stemcells (Runway hands agent
			// settings over directly); debug.cpi.api_version caps the
			// official CPI's API version, and Runway answers v3's
			// contract to every caller. Both are read and have no effect
			// (docs/configuration.md).
		case "stemcell":
			// aws: stemcell.kernel_id, refused by the aws section's check;
			// moved into the section after the loop (map order is random).
		default:
			msg := fmt.Sprintf("cloud.properties: unknown key %q", k)
			if best := driver.Closest(k, []string{o.Plugin, "agent", "registry", "debug", "stemcell"}); best != "" {
				msg += fmt.Sprintf(" (did you mean %q?)", best)
			}
			return errors.New(msg)
		}
	}
	if st, ok := o.Properties["stemcell"]; ok {
		var section map[string]json.RawMessage
		if raw, ok := c.Sections[o.Plugin]; ok {
			if err := json.Unmarshal(raw, &section); err != nil {
				return fmt.Errorf("cloud.properties.%s: must be an object: %w", o.Plugin, err)
			}
		}
		if section == nil {
			section = map[string]json.RawMessage{}
		}
		section["stemcell"] = st
		b, err := json.Marshal(section)
		if err != nil {
			return fmt.Errorf("cloud.properties.stemcell: %w", err)
		}
		c.Sections[o.Plugin] = b
	}
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
	drivers := formats.Drivers
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
	if c.LogLevel == "" {
		c.LogLevel = DefaultLogLevel
	}
	if _, err := logging.Level(c.LogLevel); err != nil {
		return &Error{Field: "log_level", Msg: err.Error()}
	}
	if c.LockTimeoutSeconds == 0 {
		c.LockTimeoutSeconds = DefaultLockTimeout
	}
	if c.LockTimeoutSeconds < 0 {
		return &Error{Field: "lock_timeout_seconds", Msg: "must be positive"}
	}
	r := &c.Retry
	if r.WaitBudgetSeconds == 0 {
		r.WaitBudgetSeconds = DefaultWaitBudgetSeconds
	}
	if r.MaxBackoffSeconds == 0 {
		r.MaxBackoffSeconds = DefaultMaxBackoffSeconds
	}
	if r.InitialBackoffMilli == 0 {
		r.InitialBackoffMilli = DefaultInitialBackoffMs
	}
	for f, v := range map[string]int{"retry.wait_budget_seconds": r.WaitBudgetSeconds, "retry.max_backoff_seconds": r.MaxBackoffSeconds, "retry.initial_backoff_ms": r.InitialBackoffMilli} {
		if v < 0 {
			return &Error{Field: f, Msg: "must be positive"}
		}
	}
	return nil
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

// DirectorContextKeys are the keys the Director puts in every request's
// context for itself; every other key is a cpi-config property.
var DirectorContextKeys = []string{"director_uuid", "request_id", "vm"}

// MergeContext puts the cpi-config properties the Director merged into the
// request context over the driver section, as the official CPIs do: the
// driver's keys at the context's top level, each replacing the section's
// key of the same meaning (official names and Runway's alike). The nested
// form context.<driver> is deep-merged first. It returns the merged
// section and the context keys that went into it (for messages); a
// context with none of them leaves the section untouched.
func (c *Config) MergeContext(ctx map[string]any) (json.RawMessage, []string, error) {
	section := c.DriverSection()
	nested, hasNested := ctx[c.Driver].(map[string]any)
	flat := map[string]any{}
	var used []string
	for k, v := range ctx {
		if k == c.Driver && hasNested || slices.Contains(DirectorContextKeys, k) {
			continue
		}
		flat[k] = v
		used = append(used, k)
	}
	if !hasNested && len(flat) == 0 {
		return section, nil, nil
	}
	var base map[string]any
	if err := json.Unmarshal(section, &base); err != nil || base == nil {
		return nil, nil, &Error{Path: c.Path, Field: c.Driver, Msg: "must be a JSON object"}
	}
	if err := driver.Normalize(c.Driver, base); err != nil {
		return nil, nil, &Error{Path: c.Path, Field: c.Driver, Msg: err.Error()}
	}
	if hasNested {
		used = append(used, c.Driver)
		if err := driver.Normalize(c.Driver, nested); err != nil {
			return nil, nil, fmt.Errorf("request context %s: %w", c.Driver, err)
		}
		base = deepMerge(base, nested)
	}
	if err := driver.Normalize(c.Driver, flat); err != nil {
		return nil, nil, fmt.Errorf("request context: %w", err)
	}
	for k, v := range flat {
		base[k] = v
	}
	sort.Strings(used)
	b, err := json.Marshal(base)
	return b, used, err
}

func deepMerge(dst, src map[string]any) map[string]any {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				dst[k] = deepMerge(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
	return dst
}

// DecodeStrict decodes one JSON object, rejecting unknown fields, wrong
// types and trailing data, with messages that name the field.
func DecodeStrict(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return describe(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}

func describe(err error) error {
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te) && te.Field != "":
		return fmt.Errorf("%s: must be %s, got %s", te.Field, jsonKind(te.Type.Kind().String()), te.Value)
	case errors.As(err, &te):
		return fmt.Errorf("must be a JSON object, got %s", te.Value)
	case errors.As(err, &se):
		return fmt.Errorf("invalid JSON at byte %d: %v", se.Offset, se)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return errors.New("invalid JSON: unexpected end of input")
	}
	if msg := err.Error(); strings.HasPrefix(msg, "json: unknown field ") {
		return fmt.Errorf("unknown field %s", strings.TrimPrefix(msg, "json: unknown field "))
	}
	return err
}

func jsonKind(k string) string {
	switch k {
	case "string":
		return "a string"
	case "int", "int64", "int32", "uint", "float64":
		return "a number"
	case "bool":
		return "a boolean"
	case "slice", "array":
		return "an array"
	case "map", "struct":
		return "an object"
	}
	return k
}

func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
