package config

import (
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/runway-cpi/runway/src/strict"
)

// Alias lets a driver's config section take an official CPI's key by its
// official name, meaning and unit: Apply turns the key's value into the
// driver's own keys (set), or refuses it with an error naming the key.
type Alias struct {
	Key   string
	Apply func(v any, set func(key string, v any)) error
}

// Rename is an official key that means exactly one of the driver's keys.
func Rename(from, to string) Alias {
	return Alias{Key: from, Apply: func(v any, set func(string, any)) error { set(to, v); return nil }}
}

// Refuse is an official key the driver does not support: setting it is an
// error saying why (unless ok accepts the value, e.g. false for a switch
// that is off).
func Refuse(key, why string, ok func(v any) bool) Alias {
	return Alias{Key: key, Apply: func(v any, _ func(string, any)) error {
		if ok != nil && ok(v) {
			return nil
		}
		return fmt.Errorf("%s is not supported: %s", key, why)
	}}
}

// IsFalse accepts a switch that is off (false or absent).
func IsFalse(v any) bool { b, ok := v.(bool); return v == nil || ok && !b }

// Normalize rewrites the official keys in one config layer (the file's
// section or the request context) into the driver's own, in place. Both
// names of one key in the same layer is an error: which one was meant?
func (s Section) Normalize(m map[string]any) error {
	for _, a := range s.Aliases {
		v, ok := m[a.Key]
		if !ok {
			continue
		}
		delete(m, a.Key)
		var clash error
		err := a.Apply(v, func(k string, nv any) {
			if old, dup := m[k]; dup && !reflect.DeepEqual(old, nv) && clash == nil {
				clash = fmt.Errorf("%s and %s name the same setting: set one of them", a.Key, k)
				return
			}
			m[k] = nv
		})
		if err == nil {
			err = clash
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// AliasKeys lists the official keys the driver takes.
func (s Section) AliasKeys() []string {
	var out []string
	for _, a := range s.Aliases {
		out = append(out, a.Key)
	}
	return out
}

// Decode reads the driver's config section into s.Config's type (into
// points to one): official keys are normalized, then every key is checked
// strictly; an unknown key is named with the closest key the driver knows
// by either name.
func (s Section) Decode(section json.RawMessage, into any) error {
	var m map[string]any
	if err := json.Unmarshal(section, &m); err != nil || m == nil {
		return fmt.Errorf("%s: must be a JSON object", s.Name)
	}
	if err := s.Normalize(m); err != nil {
		return fmt.Errorf("%s: %w", s.Name, err)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return strict.JSON(s.Name, b, into, strict.Suggest(s.AliasKeys()...))
}
