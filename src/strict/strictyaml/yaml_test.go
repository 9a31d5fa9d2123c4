package strictyaml

import (
	"errors"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

type dur struct{ time.Duration }

func (d *dur) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return errors.New("must be a duration such as \"30s\"")
	}
	d.Duration = v
	return nil
}

type ycfg struct {
	Listen string `yaml:"listen"`
	Groups []ygrp `yaml:"groups"`
	HTTP   struct {
		MaxConnections int `yaml:"max_connections"`
	} `yaml:"http"`
}

type ygrp struct {
	Name   string   `yaml:"name"`
	Max    int      `yaml:"max_active_runners"`
	Labels []string `yaml:"labels"`
	Poll   dur      `yaml:"poll_interval"`
}

func TestYAML(t *testing.T) {
	var c ycfg
	if err := Decode("config", []byte("listen: :80\ngroups:\n- name: a\n  max_active_runners: 3\n  poll_interval: 5s\n"), &c); err != nil {
		t.Fatal(err)
	}
	if c.Groups[0].Max != 3 || c.Groups[0].Poll.Duration != 5*time.Second {
		t.Fatalf("%+v", c)
	}
	for _, tc := range []struct{ in, want string }{
		{"groups:\n- name: a\n  max_active_runners: lots\n", `config.groups[0].max_active_runners: must be an integer, got a string "lots" (line 3)`},
		{"groups:\n- name: a\n  labls: [x]\n", `config.groups[0]: unknown key "labls" (did you mean "labels"?) (line 3)`},
		{"groups:\n- name: a\n  poll_interval: often\n", `config.groups[0].poll_interval: must be a duration such as "30s" (line 3)`},
		{"http:\n  max_connections: [1]\n", `config.http.max_connections: must be an integer, got a list (line 2)`},
		{"listen: [\n", `config: invalid YAML: line 1: did not find expected node content`},
		{"a: 1\n---\nb: 2\n", `config: more than one YAML document`},
	} {
		var c ycfg
		err := Decode("config", []byte(tc.in), &c)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%q: got %v, want %s", tc.in, err, tc.want)
		}
	}
}
