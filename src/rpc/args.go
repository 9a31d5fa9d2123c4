package rpc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"

	"github.com/runway-cpi/runway/src/clip"
)

// Param names one positional argument and where to decode it.
type Param struct {
	Name string
	Into any // pointer to the typed destination
	// Optional trailing arguments may be absent (e.g. create_stemcell's v3 env).
	Optional bool
	// Nullable arguments accept JSON null (e.g. create_disk's vm_cid).
	Nullable bool
}

// ArgSpec describes one positional argument of a method.
type ArgSpec struct {
	Name     string
	Type     reflect.Type
	Optional bool
	Nullable bool
}

// ArgSpecs reads a method's arguments from its Args struct: each field, in
// order, is one positional argument, tagged `arg:"name[,optional][,nullable]"`.
func ArgSpecs(t reflect.Type) []ArgSpec {
	var out []ArgSpec
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		tag := f.Tag.Get("arg")
		if tag == "" {
			panic("rpc: field " + t.String() + "." + f.Name + " has no arg tag")
		}
		parts := strings.Split(tag, ",")
		a := ArgSpec{Name: parts[0], Type: f.Type}
		for _, o := range parts[1:] {
			switch o {
			case "optional":
				a.Optional = true
			case "nullable":
				a.Nullable = true
			default:
				panic("rpc: unknown arg tag option " + o)
			}
		}
		out = append(out, a)
	}
	return out
}

// BindArgs decodes the request's positional arguments strictly into the
// fields of the Args struct args points to (see ArgSpecs).
func (r *Request) BindArgs(args any) *Error {
	v := reflect.ValueOf(args).Elem()
	specs := ArgSpecs(v.Type())
	params := make([]Param, len(specs))
	for i, a := range specs {
		params[i] = Param{Name: a.Name, Into: v.Field(i).Addr().Interface(), Optional: a.Optional, Nullable: a.Nullable}
	}
	return r.Bind(params...)
}

// Bind decodes the request's positional arguments strictly into params.
// Wrong count or type → CpiError naming the method, position and type.
func (r *Request) Bind(params ...Param) *Error {
	required := 0
	for _, p := range params {
		if !p.Optional {
			required++
		}
	}
	if n := len(r.Arguments); n < required || n > len(params) {
		want := fmt.Sprint(required)
		if required != len(params) {
			want = fmt.Sprintf("%d to %d", required, len(params))
		}
		names := make([]string, len(params))
		for i, p := range params {
			names[i] = p.Name
			if p.Optional {
				names[i] = "[" + p.Name + "]"
			}
		}
		noun := "arguments"
		if want == "1" {
			noun = "argument"
		}
		return NewError(TypeCpiError, false, "%s: expected %s %s (%s), got %d", r.Method, want, noun, strings.Join(names, ", "), n)
	}
	for i, raw := range r.Arguments {
		p := params[i]
		if isNull(raw) {
			if p.Nullable {
				continue
			}
			// Absent maps, lists and property objects are common from real
			// callers (cloud_properties: null): left empty.
			t := reflect.TypeOf(p.Into)
			if k := t.Elem().Kind(); k == reflect.Map || k == reflect.Slice || t.Implements(unmarshaler) {
				continue
			}
			return argErr(r.Method, i, p, "null")
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		if err := dec.Decode(p.Into); err != nil {
			var te *json.UnmarshalTypeError
			if errors.As(err, &te) && te.Field != "" {
				return NewError(TypeCpiError, false, "%s: argument %d (%s): field %q must be %s, got %s",
					r.Method, i+1, p.Name, te.Field, TypeName(te.Type), te.Value)
			}
			return argErr(r.Method, i, p, kindOf(raw))
		}
	}
	return nil
}

var unmarshaler = reflect.TypeFor[json.Unmarshaler]()

func argErr(method string, i int, p Param, got string) *Error {
	return NewError(TypeCpiError, false, "%s: argument %d (%s) must be %s, got %s",
		method, i+1, p.Name, TypeName(reflect.TypeOf(p.Into).Elem()), got)
}

// TypeName describes a Go type in JSON terms for error messages.
func TypeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int32, reflect.Int64, reflect.Uint, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array of " + plural(TypeName(t.Elem()))
	case reflect.Map:
		if t.Elem().Kind() == reflect.String {
			return "an object of strings"
		}
		return "an object"
	case reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return TypeName(t.Elem()) + " or null"
	case reflect.Interface:
		return "any JSON value"
	}
	return t.String()
}

func plural(s string) string {
	for _, a := range []string{"an ", "a "} {
		if len(s) > len(a) && s[:len(a)] == a {
			s = s[len(a):]
			break
		}
	}
	return s + "s"
}

func kindOf(raw json.RawMessage) string {
	b := bytes.TrimSpace(raw)
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '"':
		return "a string"
	case '{':
		return "an object"
	case '[':
		return "an array"
	case 't', 'f':
		return "a boolean"
	case 'n':
		return "null"
	}
	if bytes.ContainsAny(b, ".eE") {
		return "a non-integer number " + clip.Quote(string(b), 200)
	}
	return "a number " + clip.Quote(string(b), 200)
}
