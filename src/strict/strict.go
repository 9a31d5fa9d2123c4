// Package strict decodes JSON and YAML documents into Go values and
// refuses what a typo produces: an unknown key (named, with the closest
// known key), a value of the wrong kind (named by its field path), trailing
// data. Every decoder in Runway goes through it, so every error reads the
// same way: "<path>: <what is wrong>".
//
// A struct field of type any (or json.RawMessage) takes any value without
// a look inside: that is how a key that real callers send but that has no
// effect is accepted (see stemcellmf.Manifest).
package strict

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// Error names the field at fault. Path is empty for the document itself.
type Error struct {
	Path string
	Msg  string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Option tunes one decode.
type Option func(*options)

type options struct {
	suggest []string
}

// Suggest adds names that an unknown top-level key may be a typo of
// (official aliases the caller rewrites before decoding).
func Suggest(names ...string) Option {
	return func(o *options) { o.suggest = append(o.suggest, names...) }
}

// Suggestions are the names opts add (for strictyaml).
func Suggestions(opts ...Option) []string {
	var o options
	for _, f := range opts {
		f(&o)
	}
	return o.suggest
}

// JSON decodes one JSON value from data into v (a pointer). what names the
// document in errors ("cloud_properties", "config"); paths below it are
// joined with dots and [i].
func JSON(what string, data []byte, v any, opts ...Option) error {
	var o options
	for _, f := range opts {
		f(&o)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var generic any
	if err := dec.Decode(&generic); err != nil {
		return &Error{Path: what, Msg: syntaxMsg(err)}
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &Error{Path: what, Msg: "trailing data after the JSON value"}
	}
	if err := walkJSON(what, generic, reflect.TypeOf(v), o.suggest); err != nil {
		return err
	}
	if err := json.Unmarshal(data, v); err != nil {
		return &Error{Path: what, Msg: err.Error()}
	}
	return nil
}

func syntaxMsg(err error) string {
	var se *json.SyntaxError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("invalid JSON at byte %d: %v", se.Offset, se)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "invalid JSON: unexpected end of input"
	}
	return "invalid JSON: " + err.Error()
}

// walkJSON checks a decoded JSON value against the Go type it will be
// decoded into: keys the type has no field for, and leaves of the wrong
// kind, each named by its path.
func walkJSON(path string, v any, t reflect.Type, suggest []string) error {
	for t.Kind() == reflect.Pointer {
		if v == nil {
			return nil
		}
		t = t.Elem()
	}
	if opaque(t) {
		return leafJSON(path, v, t)
	}
	switch t.Kind() {
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return leafJSON(path, v, t)
		}
		fields := Fields(t, "json")
		for _, k := range slices.Sorted(maps.Keys(m)) {
			ft, ok := fields[k]
			if !ok {
				return Unknown(path, k, append(slices.Sorted(maps.Keys(fields)), suggest...))
			}
			if err := walkJSON(Join(path, k), m[k], ft, nil); err != nil {
				return err
			}
		}
		return nil
	case reflect.Slice, reflect.Array:
		list, ok := v.([]any)
		if !ok {
			return leafJSON(path, v, t)
		}
		for i, x := range list {
			if err := walkJSON(fmt.Sprintf("%s[%d]", path, i), x, t.Elem(), nil); err != nil {
				return err
			}
		}
		return nil
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return leafJSON(path, v, t)
		}
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if err := walkJSON(Join(path, k), m[k], t.Elem(), nil); err != nil {
				return err
			}
		}
		return nil
	}
	return leafJSON(path, v, t)
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	rawMessage      = reflect.TypeFor[json.RawMessage]()
)

// opaque types decode themselves (or take anything): no look inside.
func opaque(t reflect.Type) bool {
	return t.Kind() == reflect.Interface || t == rawMessage ||
		t.Implements(jsonUnmarshaler) || reflect.PointerTo(t).Implements(jsonUnmarshaler)
}

// leafJSON decodes one value on its own, so a kind error names its path.
func leafJSON(path string, v any, t reflect.Type) error {
	if t.Kind() == reflect.Interface || t == rawMessage {
		return nil
	}
	if v == nil {
		return nil // null leaves the zero value, as encoding/json does
	}
	b, err := json.Marshal(v)
	if err != nil {
		return &Error{Path: path, Msg: err.Error()}
	}
	if err := json.Unmarshal(b, reflect.New(t).Interface()); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field == "" {
			return &Error{Path: path, Msg: fmt.Sprintf("must be %s, got %s", KindName(t), jsonKind(v))}
		}
		return &Error{Path: path, Msg: strings.TrimPrefix(err.Error(), "json: ")}
	}
	return nil
}

// jsonKind describes a decoded JSON value (UseNumber) for messages.
func jsonKind(v any) string {
	switch x := v.(type) {
	case string:
		return "a string " + strconv.Quote(Clip(x))
	case json.Number:
		return "the number " + x.String()
	case bool:
		return "a boolean"
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// Clip shortens a value quoted in a message.
func Clip(s string) string {
	if len(s) > 60 {
		return s[:60] + "…"
	}
	return s
}

// KindName describes a Go type in JSON/YAML terms.
func KindName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "a list"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return KindName(t.Elem())
	case reflect.Bool:
		return "a boolean"
	case reflect.String:
		return "a string"
	}
	return "a " + t.Kind().String()
}

// Fields maps a struct's keys (by the tag named, "json" or "yaml") to their
// types. Embedded structs' keys are included, as both encoders treat them,
// and a key of the outer struct shadows an embedded one of the same name.
func Fields(t reflect.Type, tag string) map[string]reflect.Type {
	out := map[string]reflect.Type{}
	var embedded []reflect.Type
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, opts, _ := strings.Cut(f.Tag.Get(tag), ",")
		if name == "-" || (!f.IsExported() && !f.Anonymous) {
			continue
		}
		et := f.Type
		if et.Kind() == reflect.Pointer {
			et = et.Elem()
		}
		if f.Anonymous && name == "" && et.Kind() == reflect.Struct || tag == "yaml" && strings.Contains(opts, "inline") {
			embedded = append(embedded, et)
			continue
		}
		if name == "" {
			name = f.Name
			if tag == "yaml" {
				name = strings.ToLower(name)
			}
		}
		out[name] = f.Type
	}
	for _, et := range embedded {
		for k, v := range Fields(et, tag) {
			if _, shadowed := out[k]; !shadowed {
				out[k] = v
			}
		}
	}
	return out
}

// Unknown is the one wording for a key nobody knows: the closest known key
// when one is near, else the list.
func Unknown(path, key string, known []string) *Error {
	known = dedupe(known)
	switch best := Closest(key, known); {
	case len(known) == 0:
		return &Error{Path: path, Msg: fmt.Sprintf("unknown key %q (no key is known here)", key)}
	case best != "":
		return &Error{Path: path, Msg: fmt.Sprintf("unknown key %q (did you mean %q?)", key, best)}
	default:
		return &Error{Path: path, Msg: fmt.Sprintf("unknown key %q (known: %s)", key, strings.Join(known, ", "))}
	}
}

func dedupe(s []string) []string {
	out := append([]string(nil), s...)
	sort.Strings(out)
	j := 0
	for i, x := range out {
		if i == 0 || x != out[j-1] {
			out[j] = x
			j++
		}
	}
	return out[:j]
}

// Closest returns the candidate nearest to s by edit distance, if it is
// near enough to be what was meant ("" otherwise).
func Closest(s string, candidates []string) string {
	best, bestD := "", 1<<30
	ls := strings.ToLower(s)
	for _, c := range candidates {
		lc := strings.ToLower(c)
		d := editDistance(ls, lc)
		if len(s) >= 4 && strings.HasPrefix(lc, ls) {
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

// Join adds key to a field path.
func Join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}
