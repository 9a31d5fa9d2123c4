package config

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

type testConfig struct {
	AuthURL    string         `json:"auth_url"`
	Password   string         `json:"password"`
	Region     string         `json:"region"`
	CACert     string         `json:"ca_cert"`
	Insecure   bool           `json:"insecure"`
	Nested     map[string]any `json:"nested"`
	Shell      string         `json:"shell"`
	StopGrace  int            `json:"stop_grace_seconds"`
	Connection map[string]any `json:"connection_options_x"`
}

var testReg = Section{Name: "fake", Config: &testConfig{},
	Aliases: []Alias{Rename("api_key", "password"), {Key: "connection_options", Apply: func(v any, set func(string, any)) error {
		m, _ := v.(map[string]any)
		if b, ok := m["ssl_verify_peer"].(bool); ok {
			set("insecure", !b)
		}
		return nil
	}}},
	ContextKeys: []string{"auth_url", "password", "region", "ca_cert", "insecure", "nested"}}

func TestFlatContextKeysWinOverTheSectionAsTheDirectorSendsThem(t *testing.T) {
	section := json.RawMessage(`{"auth_url": "http://a/v3", "api_key": "file-pw", "region": "one", "connection_options": {"ssl_verify_peer": true}}`)
	// password (Runway's name) replaces api_key (the official name) from
	// the file; aliases apply to both.
	merged, used, err := MergeContext(testReg, section, map[string]any{
		"password": "ctx-pw", "region": "two", "connection_options": map[string]any{"ssl_verify_peer": false}})
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	json.Unmarshal(merged, &got)
	want := map[string]any{"auth_url": "http://a/v3", "password": "ctx-pw", "region": "two", "insecure": true}
	if !reflect.DeepEqual(got, want) || !reflect.DeepEqual(used, []string{"connection_options", "password", "region"}) {
		t.Fatalf("merged = %s, used %v", merged, used)
	}
	// No cpi-config properties: the section as it is, no work.
	same, used, err := MergeContext(testReg, section, nil)
	if err != nil || string(same) != string(section) || used != nil {
		t.Fatalf("untouched = %s %v %v", same, used, err)
	}
	// Both names of one setting in the context: which was meant?
	if _, _, err := MergeContext(testReg, section, map[string]any{"api_key": "a", "password": "b"}); err == nil ||
		!strings.Contains(err.Error(), "api_key and password name the same setting") {
		t.Fatalf("err = %v", err)
	}
}

func TestNestedContextSectionIsDeepMerged(t *testing.T) {
	merged, used, err := MergeContext(testReg, json.RawMessage(`{"region": "a", "nested": {"a": 1, "b": 2}}`),
		map[string]any{"fake": map[string]any{"region": "b", "nested": map[string]any{"b": 3.0}}})
	if err != nil || !reflect.DeepEqual(used, []string{"fake"}) {
		t.Fatal(used, err)
	}
	var got map[string]any
	json.Unmarshal(merged, &got)
	if got["region"] != "b" || got["nested"].(map[string]any)["a"] != 1.0 || got["nested"].(map[string]any)["b"] != 3.0 {
		t.Fatalf("merged = %s", merged)
	}
}

// A context may set only the keys a cpi-config carries; a key that
// configures the host is refused by name, whichever layer it comes in.
func TestContextRefusesHostKeys(t *testing.T) {
	for _, ctx := range []map[string]any{
		{"shell": "/tmp/evil"},
		{"fake": map[string]any{"shell": "/tmp/evil"}},
	} {
		_, _, err := MergeContext(testReg, json.RawMessage(`{}`), ctx)
		if err == nil || !strings.Contains(err.Error(), `"shell" configures the host and cannot come from a request context`) ||
			!strings.Contains(err.Error(), "a context may set: auth_url, password, region, ca_cert, insecure, nested") {
			t.Errorf("%v: err = %v", ctx, err)
		}
	}
	_, _, err := MergeContext(testReg, json.RawMessage(`{}`), map[string]any{"regoin": "x"})
	if err == nil || err.Error() != `request context: unknown key "regoin" (did you mean "region"?)` {
		t.Fatalf("typo: %v", err)
	}
	none := Section{Name: "host", Config: &testConfig{}}
	_, _, err = MergeContext(none, json.RawMessage(`{}`), map[string]any{"stop_grace_seconds": 1})
	if err == nil || !strings.Contains(err.Error(), "a context may set: no host key") {
		t.Fatalf("no keys: %v", err)
	}
}
