package driver

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/runway-cpi/runway/src/driver/catalog"
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/retry"
	"github.com/runway-cpi/runway/src/strict"
)

// Deps are what a driver gets besides its own config section.
type Deps struct {
	StateDir string
	Logger   logging.Logger
	Locker   *lock.Locker
	Retry    retry.Policy
	// Redact registers values that must never be logged (credentials).
	Redact func(values ...string)
	// Host is the driver's section as the config file has it, before a
	// request context's keys went over it (nil: no context): what a
	// driver holds a context's choice to (the Kubernetes namespace).
	Host json.RawMessage
}

// Factory builds a driver from its (context-merged) config section.
type Factory func(section json.RawMessage, deps Deps) (Driver, error)

// Registration is everything the CPI needs of one driver, given once by
// the driver's package (its init).
type Registration struct {
	Name string
	New  Factory
	// Config is a pointer to the driver's config struct (its keys).
	Config any
	// Aliases are the official CPI's config keys the driver takes.
	Aliases []Alias
	// ContextKeys are the driver's own keys (after aliases) that a
	// request's context — a Director cpi-config — may set: credentials,
	// endpoints, project/region/zone, defaults for VMs and disks. Every
	// other key configures the host and is refused there by name.
	ContextKeys []string
}

var registry = map[string]Registration{}

// Register makes a driver available; an executable carries the drivers
// it imports.
func Register(r Registration) {
	if _, ok := catalog.Lookup(r.Name); !ok {
		panic("driver: " + r.Name + " is not in the driver table (src/driver/catalog)")
	}
	if _, dup := registry[r.Name]; dup {
		panic("driver: " + r.Name + " registered twice")
	}
	for _, k := range r.ContextKeys {
		if _, ok := r.keys()[k]; !ok {
			panic("driver: " + r.Name + ": context key " + k + " is not a config key")
		}
	}
	registry[r.Name] = r
}

func (r Registration) keys() map[string]reflect.Type {
	return strict.Fields(reflect.TypeOf(r.Config).Elem(), "json")
}

// Lookup returns driver name's registration.
func Lookup(name string) (Registration, bool) {
	r, ok := registry[name]
	return r, ok
}

// Names lists the registered drivers, sorted.
func Names() []string {
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// MergeContext puts the cpi-config properties the Director merged into a
// request's context (props: the context without the Director's own keys)
// over the driver's config section, as the official CPIs do: the driver's
// keys at the top level (or nested under the driver's name), official
// names and Runway's alike, each replacing the section's key of the same
// meaning. Only ContextKeys may come from a context. It returns the
// merged section and the keys that went into it (for messages); no props
// leave the section as it is.
func (r Registration) MergeContext(section json.RawMessage, props map[string]any) (json.RawMessage, []string, error) {
	nested, hasNested := props[r.Name].(map[string]any)
	flat := map[string]any{}
	var used []string
	for k, v := range props {
		if k == r.Name && hasNested {
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
		return nil, nil, fmt.Errorf("%s: must be a JSON object", r.Name)
	}
	if err := r.Normalize(base); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", r.Name, err)
	}
	if hasNested {
		used = append(used, r.Name)
		if err := r.contextLayer("request context "+r.Name, nested); err != nil {
			return nil, nil, err
		}
		base = deepMerge(base, nested)
	}
	if err := r.contextLayer("request context", flat); err != nil {
		return nil, nil, err
	}
	for k, v := range flat {
		base[k] = v
	}
	sort.Strings(used)
	b, err := json.Marshal(base)
	return b, used, err
}

// contextLayer normalizes one context layer and refuses what a context may
// not set: unknown keys (named, with the closest), and host keys.
func (r Registration) contextLayer(what string, m map[string]any) error {
	if err := r.Normalize(m); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	fields := r.keys()
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if slices.Contains(r.ContextKeys, k) {
			continue
		}
		if _, ok := fields[k]; !ok {
			return strict.Unknown(what, k, append(slices.Sorted(maps.Keys(fields)), r.AliasKeys()...))
		}
		may := "no " + r.Name + " key"
		if len(r.ContextKeys) > 0 {
			may = strings.Join(r.ContextKeys, ", ")
		}
		return &strict.Error{Path: what, Msg: fmt.Sprintf("%q configures the host and cannot come from a request context (a context may set: %s)", k, may)}
	}
	return nil
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
