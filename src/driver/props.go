package driver

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"strings"
)

// Props are cloud properties as the caller sent them. They stay raw until
// the driver that knows their meaning decodes them into its own struct,
// strictly: a key the struct does not know is an error naming it (and the
// closest key it does know), never silently ignored.
type Props struct{ raw json.RawMessage }

// PropsOf makes Props from a Go value (tests, callers that build them).
func PropsOf(v any) Props {
	b, err := json.Marshal(v)
	if err != nil || bytes.Equal(b, []byte("null")) {
		return Props{}
	}
	return Props{raw: b}
}

// Empty reports whether no property was given.
func (p Props) Empty() bool {
	t := bytes.TrimSpace(p.raw)
	return len(t) == 0 || bytes.Equal(t, []byte("{}")) || bytes.Equal(t, []byte("null"))
}

// Map is a generic view of the properties (for messages, tests and
// callers that pass them on); drivers decode with Decode.
func (p Props) Map() map[string]any {
	m := map[string]any{}
	_ = json.Unmarshal(p.Raw(), &m)
	return m
}

// Raw is the properties' JSON as received.
func (p Props) Raw() json.RawMessage {
	if len(bytes.TrimSpace(p.raw)) == 0 {
		return json.RawMessage("{}")
	}
	return p.raw
}

// MarshalJSON writes the properties as received ({} when none).
func (p Props) MarshalJSON() ([]byte, error) {
	if len(bytes.TrimSpace(p.raw)) == 0 {
		return []byte("{}"), nil
	}
	return p.raw, nil
}

// UnmarshalJSON keeps an object (or null) as it is.
func (p *Props) UnmarshalJSON(b []byte) error {
	t := bytes.TrimSpace(b)
	if bytes.Equal(t, []byte("null")) {
		p.raw = nil
		return nil
	}
	if len(t) == 0 || t[0] != '{' {
		return &json.UnmarshalTypeError{Value: kindOfJSON(t), Type: reflect.TypeOf(map[string]any{})}
	}
	p.raw = append(json.RawMessage(nil), t...)
	return nil
}

// Decode reads the properties into into (a pointer to a struct), strictly.
// what names them in errors ("cloud_properties",
// "networks.private.cloud_properties").
func (p Props) Decode(what string, into any) error {
	if p.Empty() {
		return nil
	}
	var generic any
	if err := json.Unmarshal(p.raw, &generic); err != nil {
		return Invalid("%s: %v", what, err)
	}
	if err := checkKeys(what, generic, reflect.TypeOf(into)); err != nil {
		return err
	}
	if err := json.Unmarshal(p.raw, into); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Invalid("%s.%s must be %s, not %s", what, te.Field, kindName(te.Type), te.Value)
		}
		return Invalid("%s: %v", what, err)
	}
	return nil
}

// checkKeys walks a decoded JSON value beside the Go type it will be
// decoded into and refuses keys the type has no field for.
func checkKeys(path string, v any, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return nil // a type error, reported by the decoder
		}
		fields := jsonFields(t)
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			ft, ok := fields[k]
			if !ok {
				return unknownKey(path, k, fields)
			}
			if err := checkKeys(path+"."+k, m[k], ft); err != nil {
				return err
			}
		}
	case reflect.Slice, reflect.Array:
		if list, ok := v.([]any); ok {
			for i, x := range list {
				if err := checkKeys(fmt.Sprintf("%s[%d]", path, i), x, t.Elem()); err != nil {
					return err
				}
			}
		}
	case reflect.Map:
		if m, ok := v.(map[string]any); ok {
			for k, x := range m {
				if err := checkKeys(path+"."+k, x, t.Elem()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// jsonFields maps a struct's JSON keys to their types (embedded structs'
// keys included, as encoding/json treats them).
func jsonFields(t reflect.Type) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		if f.Anonymous && name == "" {
			et := f.Type
			if et.Kind() == reflect.Pointer {
				et = et.Elem()
			}
			if et.Kind() == reflect.Struct {
				for k, v := range jsonFields(et) {
					out[k] = v
				}
				continue
			}
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f.Type
	}
	return out
}

func unknownKey(path, key string, known map[string]reflect.Type) error {
	names := make([]string, 0, len(known))
	for k := range known {
		names = append(names, k)
	}
	if len(names) == 0 {
		return Invalid("%s: unknown key %q (no key is known here)", path, key)
	}
	if best := Closest(key, names); best != "" {
		return Invalid("%s: unknown key %q (did you mean %q?)", path, key, best)
	}
	return Invalid("%s: unknown key %q (known: %s)", path, key, strings.Join(sorted(names), ", "))
}

func sorted(s []string) []string { sort.Strings(s); return s }

// Closest returns the candidate nearest to s by edit distance, if it is
// near enough to be what was meant ("" otherwise).
func Closest(s string, candidates []string) string {
	best, bestD := "", 1<<30
	for _, c := range candidates {
		d := editDistance(strings.ToLower(s), strings.ToLower(c))
		if len(s) >= 4 && strings.HasPrefix(strings.ToLower(c), strings.ToLower(s)) {
			d = min(d, 2) // a key cut short: default_key for default_key_name
		}
		if d < bestD || d == bestD && c < best {
			best, bestD = c, d
		}
	}
	if bestD <= max(2, len(s)/3) {
		return best
	}
	return ""
}

// editDistance is Levenshtein's, on bytes (keys are ASCII).
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func kindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct, reflect.Pointer:
		return "an object"
	case reflect.Bool:
		return "a boolean"
	case reflect.String:
		return "a string"
	}
	return "a " + t.Kind().String()
}

func kindOfJSON(b []byte) string {
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '"':
		return "string"
	case '[':
		return "array"
	case 't', 'f':
		return "bool"
	}
	return "number"
}
