package doccheck

import (
	"os"
	"os/exec"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/runway-cpi/runway/"

// TestArchitecturePackageTable holds docs/architecture.md's package table
// to `go list`: every package of src/ has a row, every row names real
// packages, and each row's "depends on (ours)" column is exactly the
// module packages its packages import (outside the row itself; packages
// that are tests only, their Go files at most a doc.go: their tests'
// imports).
func TestArchitecturePackageTable(t *testing.T) {
	rows := packageRows(t)
	imports := goListImports(t)
	seen := map[string]bool{}
	for _, r := range rows {
		want := map[string]bool{}
		for _, p := range r.pkgs {
			deps, ok := imports[p]
			if !ok {
				t.Errorf("docs/architecture.md names %s, which `go list ./src/...` does not list", p)
				continue
			}
			seen[p] = true
			for _, d := range deps {
				if !slices.Contains(r.pkgs, d) {
					want[strings.TrimPrefix(d, "src/")] = true
				}
			}
		}
		got := map[string]bool{}
		for _, d := range r.deps {
			got[d] = true
		}
		for d := range want {
			if !got[d] {
				t.Errorf("row %v: imports %s, not listed under \"depends on (ours)\"", r.pkgs, d)
			}
		}
		for d := range got {
			if !want[d] {
				t.Errorf("row %v: lists %s under \"depends on (ours)\", but imports it nowhere", r.pkgs, d)
			}
		}
	}
	for p := range imports {
		if !seen[p] {
			t.Errorf("package %s has no row in docs/architecture.md's package table", p)
		}
	}
}

type pkgRow struct {
	pkgs, deps []string
	owns       string // the middle column
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

// packageRows reads the table under "## Packages". First column: package
// paths in backticks; `src/a/b` is absolute, `.../c` or `c` is a sibling
// of the name before it. Last column: module packages relative to src/,
// comma-separated, then optionally "; " and third-party notes; "nothing"
// for none.
func packageRows(t *testing.T) []pkgRow {
	b, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "\n## Packages\n")
	if !ok {
		t.Fatal(`docs/architecture.md has no "## Packages" section`)
	}
	var rows []pkgRow
	for _, line := range strings.Split(after, "\n") {
		if strings.HasPrefix(line, "## ") {
			break
		}
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		r := pkgRow{owns: strings.Join(cells[1:len(cells)-1], " | ")}
		prev := ""
		for _, m := range codeSpan.FindAllStringSubmatch(cells[0], -1) {
			name := strings.TrimPrefix(m[1], ".../")
			if !strings.HasPrefix(name, "src/") {
				name = path.Join(path.Dir(prev), name)
			}
			r.pkgs = append(r.pkgs, name)
			prev = name
		}
		deps, _, _ := strings.Cut(cells[len(cells)-1], ";")
		if deps = strings.TrimSpace(deps); deps != "nothing" {
			for _, d := range strings.Split(deps, ",") {
				r.deps = append(r.deps, strings.TrimSpace(d))
			}
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		t.Fatal("docs/architecture.md's package table has no rows")
	}
	return rows
}

// goListImports maps each package under src/ (relative to the module) to
// the module packages it imports.
func goListImports(t *testing.T) map[string][]string {
	cmd := exec.Command("go", "list", "-f",
		"{{.ImportPath}} {{if eq (join .GoFiles \",\") \"\" \"doc.go\"}}{{join .TestImports \" \"}} {{join .XTestImports \" \"}}{{else}}{{join .Imports \" \"}}{{end}}",
		"./src/...")
	cmd.Dir = "../.."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	m := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		p := strings.TrimPrefix(f[0], module)
		m[p] = []string{}
		for _, imp := range f[1:] {
			if d, ok := strings.CutPrefix(imp, module); ok && d != p && !slices.Contains(m[p], d) {
				m[p] = append(m[p], d)
			}
		}
	}
	return m
}
