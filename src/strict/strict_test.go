package strict

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

type inner struct {
	Size int    `json:"size"`
	Type string `json:"type"`
}

type base struct {
	Name    any `json:"name"`
	Version any `json:"version"`
}

type doc struct {
	base
	Name     string            `json:"name"` // shadows base.Name
	Disks    []inner           `json:"disks"`
	Tags     map[string]string `json:"tags"`
	Ptr      *inner            `json:"ptr"`
	Anything any               `json:"anything"`
	Raw      json.RawMessage   `json:"raw"`
	Wait     dur               `json:"wait"`
}

type dur struct{ time.Duration }

func (d *dur) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New("must be a duration such as \"30s\"")
	}
	v, err := time.ParseDuration(s)
	d.Duration = v
	return err
}

func TestJSONAccepts(t *testing.T) {
	var d doc
	err := JSON("props", []byte(`{"name":"x","version":"1.2","disks":[{"size":3,"type":"gp3"}],
		"tags":{"a":"b"},"ptr":{"size":1},"anything":{"deep":[1,{"x":null}]},"raw":[1],"wait":"2s"}`), &d)
	if err != nil {
		t.Fatal(err)
	}
	if d.Name != "x" || d.Version != "1.2" || d.Disks[0].Size != 3 || d.Ptr.Size != 1 || d.Wait.Duration != 2*time.Second {
		t.Fatalf("decoded %+v", d)
	}
}

func TestJSONRefusesByPath(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`{"nmae":"x"}`, `props: unknown key "nmae" (did you mean "name"?)`},
		{`{"disks":[{"size":1},{"szie":2}]}`, `props.disks[1]: unknown key "szie" (did you mean "size"?)`},
		{`{"disks":[{"size":"big"}]}`, `props.disks[0].size: must be an integer, got a string "big"`},
		{`{"disks":[{"size":1.5}]}`, `props.disks[0].size: must be an integer, got the number 1.5`},
		{`{"tags":{"a":1}}`, `props.tags.a: must be a string, got the number 1`},
		{`{"ptr":{"zzzzzzz":1}}`, `props.ptr: unknown key "zzzzzzz" (known: size, type)`},
		{`{"name":"x"} {}`, `props: trailing data after the JSON value`},
		{`{"name":`, `props: invalid JSON: unexpected end of input`},
		{`{"wait":"soon"}`, `props.wait: time: invalid duration "soon"`},
		{`{"wait":5}`, `props.wait: must be a duration such as "30s"`},
		{`[1]`, `props: must be an object, got a list`},
	} {
		var d doc
		err := JSON("props", []byte(c.in), &d)
		var se *Error
		if !errors.As(err, &se) || err.Error() != c.want {
			t.Errorf("%s: got %v, want %s", c.in, err, c.want)
		}
	}
}

func TestSuggestNamesAliases(t *testing.T) {
	var d inner
	err := JSON("aws", []byte(`{"ec2_endpont":"x"}`), &d, Suggest("ec2_endpoint"))
	if err == nil || !strings.Contains(err.Error(), `did you mean "ec2_endpoint"`) {
		t.Fatal(err)
	}
}

func TestClosest(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"instnace_type", "instance_type"},
		{"default_key", "default_key_name"},
		{"zzz", ""},
	} {
		if got := Closest(c.in, []string{"instance_type", "default_key_name", "availability_zone"}); got != c.want {
			t.Errorf("Closest(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
