package driver

import (
	"encoding/json"
	"errors"
)

// DecodeProps reads free-form cloud properties into a typed struct. Keys
// it does not know are ignored (cloud properties are shared with hooks and
// other tools); a known key with the wrong type is an input error naming
// what and the key.
func DecodeProps(what string, p map[string]any, into any) error {
	if len(p) == 0 {
		return nil
	}
	b, err := json.Marshal(p)
	if err != nil {
		return Invalid("%s: %v", what, err)
	}
	if err := json.Unmarshal(b, into); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return Invalid("%s.%s must be %s, not %s", what, te.Field, kindName(te.Type.Kind().String()), te.Value)
		}
		return Invalid("%s: %v", what, err)
	}
	return nil
}

func kindName(k string) string {
	switch k {
	case "int", "int32", "int64":
		return "an integer"
	case "slice":
		return "a list"
	case "map", "struct", "ptr":
		return "an object"
	case "bool":
		return "a boolean"
	}
	return "a " + k
}
