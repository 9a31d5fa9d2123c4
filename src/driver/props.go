package driver

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"

	"github.com/runway-cpi/runway/src/strict"
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

// Decode reads the properties into into (a pointer to a struct), strictly
// (src/strict). what names them in errors ("cloud_properties",
// "networks.private.cloud_properties").
func (p Props) Decode(what string, into any) error {
	if p.Empty() {
		return nil
	}
	if err := strict.JSON(what, p.raw, into); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidInput, err)
	}
	return nil
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
