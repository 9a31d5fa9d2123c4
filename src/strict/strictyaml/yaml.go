// Package strictyaml is src/strict for YAML documents (the orchestrator's
// config): the same rules and wording, with the line of each error. It is
// a package of its own so that bin/cpi, which reads JSON only, does not
// link and initialise a YAML parser on every call.
package strictyaml

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/runway-cpi/runway/src/strict"
)

var yamlUnmarshaler = reflect.TypeFor[yaml.Unmarshaler]()

// opaque types decode themselves (or take anything): no look inside.
func opaque(t reflect.Type) bool {
	return t.Kind() == reflect.Interface || t.Implements(yamlUnmarshaler) || reflect.PointerTo(t).Implements(yamlUnmarshaler)
}

func keys(m map[string]reflect.Type) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Decode decodes one YAML document from data into v (a pointer), with the
// same rules and wording as strict.JSON (keys by their yaml tags); each
// error also gives the line.
func Decode(what string, data []byte, v any, opts ...strict.Option) error {
	suggest := strict.Suggestions(opts...)
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty document: the zero value
		}
		return &strict.Error{Path: what, Msg: "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return &strict.Error{Path: what, Msg: "more than one YAML document"}
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	if err := walkYAML(what, root, reflect.TypeOf(v), suggest); err != nil {
		return err
	}
	if err := root.Decode(v); err != nil {
		return &strict.Error{Path: what, Msg: yamlMsg(err)}
	}
	return nil
}

func walkYAML(path string, n *yaml.Node, t reflect.Type, suggest []string) error {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if isNull(n) {
		return nil
	}
	if opaque(t) {
		return leafYAML(path, n, t)
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return leafYAML(path, n, t)
		}
		fields := strict.Fields(t, "yaml")
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i].Value, n.Content[i+1]
			if k == "<<" { // a merge key: its mapping's keys land here
				if err := walkYAML(path, val, t, suggest); err != nil {
					return err
				}
				continue
			}
			ft, ok := fields[k]
			if !ok {
				e := strict.Unknown(path, k, append(keys(fields), suggest...))
				e.Msg += line(n.Content[i])
				return e
			}
			if err := walkYAML(strict.Join(path, k), val, ft, nil); err != nil {
				return err
			}
		}
		return nil
	case reflect.Slice, reflect.Array:
		if n.Kind != yaml.SequenceNode {
			return leafYAML(path, n, t)
		}
		for i, x := range n.Content {
			if err := walkYAML(fmt.Sprintf("%s[%d]", path, i), x, t.Elem(), nil); err != nil {
				return err
			}
		}
		return nil
	case reflect.Map:
		if n.Kind != yaml.MappingNode {
			return leafYAML(path, n, t)
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := walkYAML(strict.Join(path, n.Content[i].Value), n.Content[i+1], t.Elem(), nil); err != nil {
				return err
			}
		}
		return nil
	}
	return leafYAML(path, n, t)
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// leafYAML decodes one node on its own, so a kind error names its path.
func leafYAML(path string, n *yaml.Node, t reflect.Type) error {
	if t.Kind() == reflect.Interface {
		return nil
	}
	if err := n.Decode(reflect.New(t).Interface()); err != nil {
		var te *yaml.TypeError
		if errors.As(err, &te) && !opaque(t) {
			return &strict.Error{Path: path, Msg: fmt.Sprintf("must be %s, got %s%s", strict.KindName(t), yamlKind(n), line(n))}
		}
		return &strict.Error{Path: path, Msg: yamlMsg(err) + line(n)}
	}
	return nil
}

func yamlKind(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "an object"
	case yaml.SequenceNode:
		return "a list"
	}
	switch n.Tag {
	case "!!int", "!!float":
		return "the number " + n.Value
	case "!!bool":
		return "a boolean"
	}
	return "a string " + strconv.Quote(strict.Clip(n.Value))
}

var yamlLinePrefix = regexp.MustCompile(`^(yaml: )?(unmarshal errors:\s*)?(line \d+: )?`)

// yamlMsg is a yaml.v3 error without its package and line prefixes (the
// line is added by whoever knows the node).
func yamlMsg(err error) string {
	return strings.TrimSpace(yamlLinePrefix.ReplaceAllString(err.Error(), ""))
}

func line(n *yaml.Node) string {
	if n.Line == 0 {
		return ""
	}
	return fmt.Sprintf(" (line %d)", n.Line)
}
