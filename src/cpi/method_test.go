package cpi

import (
	"os"
	"strings"
	"testing"
)

// hooksTable is the per-method table of docs/hooks.md, from the method
// descriptors.
func hooksTable() string {
	var b strings.Builder
	b.WriteString("| method | `CPI_OBJECT_TYPE` | argument variables |\n|---|---|---|\n")
	for _, name := range Methods() {
		m, _ := Lookup(name)
		vars := strings.Join(HookVariables(m), ", ")
		if vars == "" {
			vars = "—"
		}
		b.WriteString("| " + name + " | " + m.Object + " | " + vars + " |\n")
	}
	return b.String()
}

// docs/hooks.md lists what each method's scripts get: it must be what the
// descriptors say.
func TestHooksDocMatchesTheMethods(t *testing.T) {
	doc, err := os.ReadFile("../../docs/hooks.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- methods: begin -->\n", "<!-- methods: end -->"
	i, j := strings.Index(string(doc), begin), strings.Index(string(doc), end)
	if i < 0 || j < i {
		t.Fatalf("docs/hooks.md has no %q … %q section", strings.TrimSpace(begin), end)
	}
	if got, want := string(doc[i+len(begin):j]), hooksTable(); got != want {
		t.Errorf("docs/hooks.md's method table is out of date; it should read:\n%s", want)
	}
}

// Every method's arguments are described (a name for each position).
func TestEveryMethodDescribesItsArguments(t *testing.T) {
	for _, name := range Methods() {
		m, _ := Lookup(name)
		if m.Object == "" {
			t.Errorf("%s has no object type", name)
		}
		seen := map[string]bool{}
		for _, a := range m.Args {
			if a.Name == "" || seen[a.Name] {
				t.Errorf("%s: argument names %v", name, m.Args)
			}
			seen[a.Name] = true
		}
	}
}
