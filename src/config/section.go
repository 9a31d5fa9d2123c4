package config

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strings"

	"github.com/runway-cpi/runway/src/strict"
)

// Section is what is known of one driver's config section besides its
// raw JSON (Config.Sections): its keys, the official CPI's keys it takes,
// and the keys a request context may set. A driver gives it once, in its
// registration (driver.Registration).
type Section struct {
	Name string
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

// Keys are the section's own keys (its config struct's json fields).
func (s Section) Keys() map[string]reflect.Type {
	return strict.Fields(reflect.TypeOf(s.Config).Elem(), "json")
}

// MergeContext puts the cpi-config properties the Director merged into a
// request's context (props: the context without the Director's own keys)
// over the driver's config section, as the official CPIs do: the driver's
// keys at the top level (or nested under the driver's name), official
// names and Runway's alike, each replacing the section's key of the same
// meaning. Only s.ContextKeys may come from a context. It returns the
// merged section and the keys that went into it (for messages); no props
// leave the section as it is.
func MergeContext(s Section, section json.RawMessage, props map[string]any) (json.RawMessage, []string, error) {
	nested, hasNested := props[s.Name].(map[string]any)
	flat := map[string]any{}
	var used []string
	for k, v := range props {
		if k == s.Name && hasNested {
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
		return nil, nil, fmt.Errorf("%s: must be a JSON object", s.Name)
	}
	if err := s.Normalize(base); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", s.Name, err)
	}
	if hasNested {
		used = append(used, s.Name)
		if err := s.contextLayer("request context "+s.Name, nested); err != nil {
			return nil, nil, err
		}
		base = deepMerge(base, nested)
	}
	if err := s.contextLayer("request context", flat); err != nil {
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
func (s Section) contextLayer(what string, m map[string]any) error {
	if err := s.Normalize(m); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	fields := s.Keys()
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if slices.Contains(s.ContextKeys, k) {
			continue
		}
		if _, ok := fields[k]; !ok {
			return strict.Unknown(what, k, append(slices.Sorted(maps.Keys(fields)), s.AliasKeys()...))
		}
		may := "no " + s.Name + " key"
		if len(s.ContextKeys) > 0 {
			may = strings.Join(s.ContextKeys, ", ")
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
