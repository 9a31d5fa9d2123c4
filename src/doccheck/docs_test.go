package doccheck

import (
	"encoding"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/aws"
	"github.com/runway-cpi/runway/src/driver/kubernetes"
	"github.com/runway-cpi/runway/src/driver/local"
	"github.com/runway-cpi/runway/src/driver/openstack"
	"github.com/runway-cpi/runway/src/driver/vsphere"
	"github.com/runway-cpi/runway/src/garm"
	"github.com/runway-cpi/runway/src/hooks"
	orchcfg "github.com/runway-cpi/runway/src/orchestrator/config"
)

// A config section, its struct and where its table is.
type section struct {
	doc, heading string
	table        int // which table under the heading
	v            any
	tag          string   // json or yaml
	leaves       []string // keys whose values are documented as a whole
	extra        []string // keys decoded outside the struct
}

func TestConfigDocsMatchTheCode(t *testing.T) {
	for _, s := range []section{
		{doc: "configuration.md", heading: "## Top level", v: config.Config{}, tag: "json",
			leaves: []string{"hooks", "garm", "agent.blobstore"}, extra: driver.Names()},
		{doc: "configuration.md", heading: "## `local`", v: local.Config{}, tag: "json"},
		{doc: "openstack.md", heading: "## Configuration", v: openstack.Config{}, tag: "json"},
		{doc: "aws.md", heading: "## Configuration", v: aws.Config{}, tag: "json"},
		{doc: "kubernetes.md", heading: "## Configuration", v: kubernetes.Config{}, tag: "json",
			leaves: []string{"allowed_tolerations", "allowed_affinities", "host_aliases"}},
		{doc: "vsphere.md", heading: "## Configuration", v: vsphere.Config{}, tag: "json", leaves: []string{"datacenters[].clusters"}},
		{doc: "hooks.md", heading: "## Configuration (the `hooks` section of the CPI config)", v: hooks.Config{}, tag: "json",
			leaves: []string{"extensions[].settings"}},
		{doc: "garm.md", heading: "## garm configuration", v: garm.Config{}, tag: "json",
			leaves: []string{"networks", "cloud_properties", "flavors", "images.*.cloud_properties"}},
		{doc: "orchestrator.md", heading: "## Configuration reference", v: orchcfg.Config{}, tag: "yaml",
			leaves: []string{"groups[].cloud_properties", "groups[].networks", "groups[].stemcell.cloud_properties", "groups[].runner.env", "groups[].runner.args"}},
	} {
		t.Run(s.doc+" "+s.heading, func(t *testing.T) {
			code := keys(reflect.TypeOf(s.v), "", s.tag, s.leaves)
			code = append(code, s.extra...)
			doc := docKeys(t, s.doc, s.heading, s.table)
			for _, k := range code {
				if !slices.Contains(doc, k) {
					t.Errorf("%s decodes %q; docs/%s (%s) does not document it", reflect.TypeOf(s.v), k, s.doc, s.heading)
				}
			}
			for _, k := range doc {
				if !slices.Contains(code, k) {
					t.Errorf("docs/%s (%s) documents %q; %s does not decode it", s.doc, s.heading, k, reflect.TypeOf(s.v))
				}
			}
		})
	}
}

var (
	unmarshalerJSON = reflect.TypeFor[json.Unmarshaler]()
	unmarshalerYAML = reflect.TypeFor[yaml.Unmarshaler]()
	unmarshalerText = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// keys lists the dotted key paths a struct decodes: slices of structs
// as "name[].", maps of structs as "name.*.", anything that decodes
// itself (durations, raw JSON) and the listed leaves as one key.
func keys(t reflect.Type, prefix, tag string, leaves []string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get(tag), ",")
		if f.Anonymous && name == "" {
			out = append(out, keys(f.Type, prefix, tag, leaves)...)
			continue
		}
		if name == "-" || name == "" {
			continue
		}
		key := prefix + name
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		selfDecoding := reflect.PointerTo(ft).Implements(unmarshalerJSON) || reflect.PointerTo(ft).Implements(unmarshalerYAML) ||
			reflect.PointerTo(ft).Implements(unmarshalerText) || ft == reflect.TypeFor[json.RawMessage]()
		switch {
		case slices.Contains(leaves, key) || selfDecoding:
			out = append(out, key)
		case ft.Kind() == reflect.Struct:
			out = append(out, keys(ft, key+".", tag, leaves)...)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct:
			out = append(out, keys(ft.Elem(), key+"[].", tag, leaves)...)
		case ft.Kind() == reflect.Map && ft.Elem().Kind() == reflect.Struct:
			out = append(out, keys(ft.Elem(), key+".*.", tag, leaves)...)
		default:
			out = append(out, key)
		}
	}
	return out
}

var (
	backticked  = regexp.MustCompile("`([^`]+)`")
	placeholder = regexp.MustCompile(`<[^>]*>`)
)

// docKeys reads the keys in the first column of the table-th table under
// heading. A cell may name several keys: "`a` / `b`", "`a`, `b`"; ones
// after the first may be relative to it: "`x.a`, `.b`" is x.a and x.b,
// "`x.a_file` / `_env`" is x.a_file and x.a_env, "`x.a` / `b`" is x.a
// and x.b. "<name>" stands for any map key ("*").
func docKeys(t *testing.T, doc, heading string, table int) []string {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", doc))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	start := slices.Index(lines, heading)
	if start < 0 {
		t.Fatalf("docs/%s has no heading %q", doc, heading)
	}
	level := strings.Index(heading, " ")
	var out []string
	tables, inTable := -1, false
	for _, l := range lines[start+1:] {
		if strings.HasPrefix(l, "#") && strings.Index(l, " ") <= level {
			break
		}
		if !strings.HasPrefix(l, "|") {
			inTable = false
			continue
		}
		if !inTable {
			inTable = true
			tables++
		}
		if tables != table {
			continue
		}
		cells := strings.Split(l, "|")
		if len(cells) < 3 {
			continue
		}
		var first string
		for i, m := range backticked.FindAllStringSubmatch(cells[1], -1) {
			k := placeholder.ReplaceAllString(m[1], "*")
			parent := ""
			if j := strings.LastIndex(first, "."); j >= 0 {
				parent = first[:j]
			}
			switch {
			case i == 0:
				first = k
			case strings.HasPrefix(k, "."):
				k = parent + k
			case strings.HasPrefix(k, "_"):
				stem := first[:strings.LastIndex(first, "_")]
				k = stem + k
			case parent != "" && !strings.Contains(k, "."):
				k = parent + "." + k
			}
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		t.Fatalf("docs/%s: no keys in table %d under %q", doc, table, heading)
	}
	return out
}

// Every official key a driver takes (its aliases) and every official
// property the runway_cpi job declares has a row in the driver's
// migration table.
func TestMigrationTablesCoverEveryOfficialKey(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "jobs", "runway_cpi", "spec"))
	if err != nil {
		t.Fatal(err)
	}
	var spec struct {
		Properties map[string]any `yaml:"properties"`
	}
	if err := yaml.Unmarshal(b, &spec); err != nil {
		t.Fatal(err)
	}
	// The official job's property prefix, where it is not the driver's name.
	prefix := map[string]string{"vsphere": "vcenter"}
	for _, iaas := range []string{"openstack", "aws", "vsphere"} {
		doc := docKeys(t, iaas+".md", "## Migration from the official CPI", 0)
		covered := func(k string) bool {
			return slices.ContainsFunc(doc, func(d string) bool { return d == k || strings.HasPrefix(d, k+".") })
		}
		reg, _ := driver.Lookup(iaas)
		official := reg.AliasKeys()
		for p := range spec.Properties {
			pre := iaas
			if x, ok := prefix[iaas]; ok {
				pre = x
			}
			if k, ok := strings.CutPrefix(p, pre+"."); ok {
				official = append(official, k)
			}
		}
		if len(official) < 10 {
			t.Fatalf("%s: only %d official keys found", iaas, len(official))
		}
		for _, k := range official {
			if !covered(k) {
				t.Errorf("docs/%s.md's migration table has no row for the official key %q", iaas, k)
			}
		}
	}
}
