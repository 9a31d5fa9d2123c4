package doccheck

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// goPkg is what the docs may name of one package of the module: its
// exported declarations and each type's fields and methods, read from
// its non-test Go files.
type goPkg struct {
	dir, name string              // dir relative to the repository, "src/config"
	decls     map[string]bool     // top-level names
	members   map[string][]string // type → its fields and methods
	embeds    map[string][]typeRef
}

// typeRef is a type embedded in another; pkg is the module package's
// directory, "" for a package outside the module.
type typeRef struct{ pkg, name string }

// modulePackages parses every Go package under src/ with go/parser.
func modulePackages(t *testing.T) map[string]*goPkg {
	pkgs := map[string]*goPkg{}
	fset := token.NewFileSet()
	err := filepath.WalkDir("..", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != ".." && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") || strings.HasPrefix(d.Name(), "_")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		dir := path.Join("src", filepath.ToSlash(filepath.Dir(strings.TrimPrefix(p, "../"))))
		g := pkgs[dir]
		if g == nil {
			g = &goPkg{dir: dir, name: f.Name.Name, decls: map[string]bool{}, members: map[string][]string{}, embeds: map[string][]typeRef{}}
			pkgs[dir] = g
		}
		g.add(f)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 20 {
		t.Fatalf("only %d packages found under src/", len(pkgs))
	}
	return pkgs
}

func (g *goPkg) add(f *ast.File) {
	imports := map[string]string{} // a file's name for an import → its module directory
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		dir, ours := strings.CutPrefix(p, module)
		name := path.Base(p)
		if im.Name != nil {
			name = im.Name.Name
		}
		if !ours {
			dir = ""
		}
		imports[name] = dir
	}
	embedded := func(e ast.Expr) (typeRef, bool) {
		for {
			switch x := e.(type) {
			case *ast.StarExpr:
				e = x.X
			case *ast.IndexExpr:
				e = x.X
			case *ast.IndexListExpr:
				e = x.X
			case *ast.Ident:
				return typeRef{g.dir, x.Name}, true
			case *ast.SelectorExpr:
				id, ok := x.X.(*ast.Ident)
				if !ok {
					return typeRef{}, false
				}
				return typeRef{imports[id.Name], x.Sel.Name}, true
			default:
				return typeRef{}, false
			}
		}
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				g.decls[d.Name.Name] = true
			} else if r, ok := embedded(d.Recv.List[0].Type); ok {
				g.members[r.name] = append(g.members[r.name], d.Name.Name)
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for _, n := range s.Names {
						g.decls[n.Name] = true
					}
				case *ast.TypeSpec:
					name := s.Name.Name
					g.decls[name] = true
					if s.Assign.IsValid() { // an alias has its target's members
						if r, ok := embedded(s.Type); ok {
							g.embeds[name] = append(g.embeds[name], r)
						}
					}
					var fields *ast.FieldList
					switch t := s.Type.(type) {
					case *ast.StructType:
						fields = t.Fields
					case *ast.InterfaceType:
						fields = t.Methods
					}
					if fields == nil {
						continue
					}
					for _, fl := range fields.List {
						for _, n := range fl.Names {
							g.members[name] = append(g.members[name], n.Name)
						}
						if len(fl.Names) == 0 {
							if r, ok := embedded(fl.Type); ok {
								g.members[name] = append(g.members[name], r.name)
								g.embeds[name] = append(g.embeds[name], r)
							}
						}
					}
				}
			}
		}
	}
}

// has reports whether sym ("Name" or "Type.Member") is declared in g.
// A member promoted from a type outside the module cannot be checked
// here and is taken as there.
func (g *goPkg) has(pkgs map[string]*goPkg, sym string) bool {
	typ, member, ok := strings.Cut(sym, ".")
	if !g.decls[typ] {
		return false
	}
	return !ok || hasMember(pkgs, typeRef{g.dir, typ}, member, map[typeRef]bool{})
}

func hasMember(pkgs map[string]*goPkg, t typeRef, member string, seen map[typeRef]bool) bool {
	g := pkgs[t.pkg]
	if t.pkg == "" || g == nil {
		return true
	}
	if seen[t] {
		return false
	}
	seen[t] = true
	if slices.Contains(g.members[t.name], member) {
		return true
	}
	for _, e := range g.embeds[t.name] {
		if hasMember(pkgs, e, member, seen) {
			return true
		}
	}
	return false
}

var (
	// pkg.Symbol or pkg.Type.Member, optionally with fields: pkg.Type{A, B: x}.
	symbolRef = regexp.MustCompile(`(?:^|[^\w./-])([a-z][a-z0-9_]*)\.([A-Z]\w*(?:\.[A-Z]\w*)?)(\{[^}]*\})?`)
	// A path in the repository: src/..., scripts/..., docs/...; src/a/b.Symbol names
	// a symbol of the package in src/a/b.
	pathRef    = regexp.MustCompile(`(?:^|[^\w./-])(?:\./)?((?:src|scripts|docs)/[\w./<>*-]+)`)
	pathSymbol = regexp.MustCompile(`^(.*/[\w-]+)\.([A-Z]\w*(?:\.[A-Z]\w*)?)$`)
	exported   = regexp.MustCompile(`^[A-Z]\w*(?:\.[A-Z]\w*)?$`)
	fieldKey   = regexp.MustCompile(`^([A-Z]\w*)\s*(?::|$)`)
)

// TestDocsNameRealCode holds every Go package symbol and repository path
// the docs name to the code: `pkg.Symbol`, `pkg.Type.Member` and
// `pkg.Type{Field}` where pkg is the name of a package of the module (any
// of the packages of that name has it), `src/a/b.Symbol` (that package),
// paths under src/ (of src/'s own top directories: the docs quote other
// trees' src/ too), scripts/ and docs/ (up to a `<placeholder>`), and the
// exported names in backticks in a row of docs/architecture.md's package
// table (one of the row's packages has it).
func TestDocsNameRealCode(t *testing.T) {
	c := readCode(t)
	files := []string{"README.md"}
	err := filepath.WalkDir("../../docs", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, strings.TrimPrefix(filepath.ToSlash(p), "../../"))
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	checked := 0
	for _, file := range files {
		b, err := os.ReadFile(filepath.Join("..", "..", file))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			n, errs := c.line(line)
			checked += n
			for _, e := range errs {
				t.Errorf("%s:%d %s", file, i+1, e)
			}
		}
	}
	for _, r := range packageRows(t) {
		n, errs := c.row(r)
		checked += n
		for _, e := range errs {
			t.Errorf("docs/architecture.md's package table: %s", e)
		}
	}
	t.Logf("%d references checked", checked)
	if checked < 50 {
		t.Errorf("only %d references found in the docs; is the scan broken?", checked)
	}
}

// The checker itself: each wrong name below is reported, each right one
// is not.
func TestDocsNameRealCodeCatchesWrongNames(t *testing.T) {
	c := readCode(t)
	for line, want := range map[string]int{
		"`driver.Driver`, `rpc.Request.BindArgs`, `driver.CreationError{Retryable}`, src/testkit/testenv.Need, `src/driver/<name>/`": 0,
		"`lock.New`, retry.Policy, scripts/test, docs/testing.md, src/webapp/serve (another tree's), strict.JSON":                    0,
		"`driver.NoSuchThing`, `cpi.Service.NoSuchMethod`, `driver.CreationError{Retryable, NoSuchField: x}`":                        3,
		"`config.NoSuch` (neither config has it), src/testkit/testenv.NoSuchFunc, src/testkit/nosuchdir, scripts/nosuch":             4,
		"`rpc.BindArgs` (a method, not a function), `src/cpi/nosuch/<name>.go`":                                                      2,
	} {
		if _, errs := c.line(line); len(errs) != want {
			t.Errorf("%q: %d errors, want %d: %q", line, len(errs), want, errs)
		}
	}
	row := pkgRow{pkgs: []string{"src/rpc", "src/lock"}, owns: "`Request`/`NewRequest`, `New`, `Request.BindArgs`, `NoSuchType`, `Request.NoSuch`, `BindArgs`"}
	if n, errs := c.row(row); n != 7 || len(errs) != 3 {
		t.Errorf("row %v: %d checked, want 7; %d errors, want 3: %q", row, n, len(errs), errs)
	}
}

// code is what docs may name: the module's packages by directory and by
// name, and src/'s top directories.
type code struct {
	pkgs   map[string]*goPkg
	byName map[string][]*goPkg
	srcTop map[string]bool
}

func readCode(t *testing.T) *code {
	c := &code{pkgs: modulePackages(t), byName: map[string][]*goPkg{}, srcTop: map[string]bool{}}
	for _, g := range c.pkgs {
		if g.name != "main" {
			c.byName[g.name] = append(c.byName[g.name], g)
		}
	}
	tops, err := os.ReadDir("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range tops {
		c.srcTop[e.Name()] = e.IsDir()
	}
	return c
}

// line checks the references in one line of a doc: how many, and what is wrong.
func (c *code) line(line string) (checked int, errs []string) {
	for _, m := range symbolRef.FindAllStringSubmatch(line, -1) {
		cands := c.byName[m[1]]
		if len(cands) == 0 {
			continue
		}
		checked++
		for _, sym := range withFields(m[2], m[3]) {
			if !slices.ContainsFunc(cands, func(g *goPkg) bool { return g.has(c.pkgs, sym) }) {
				errs = append(errs, fmt.Sprintf("names %s.%s; no package named %s (%s) declares it", m[1], sym, m[1], dirs(cands)))
			}
		}
	}
	for _, m := range pathRef.FindAllStringSubmatch(line, -1) {
		p := strings.TrimRight(m[1], ".")
		if top, _, _ := strings.Cut(strings.TrimPrefix(p, "src/"), "/"); strings.HasPrefix(p, "src/") && !c.srcTop[top] {
			continue
		}
		checked++
		if s := pathSymbol.FindStringSubmatch(p); s != nil && c.pkgs[s[1]] != nil {
			if !c.pkgs[s[1]].has(c.pkgs, s[2]) {
				errs = append(errs, fmt.Sprintf("names %s; %s does not declare %s", p, s[1], s[2]))
			}
			continue
		}
		if j := strings.IndexAny(p, "<*"); j >= 0 {
			p = p[:strings.LastIndex(p[:j], "/")+1]
		}
		if _, err := os.Stat(filepath.Join("..", "..", p)); err != nil {
			errs = append(errs, fmt.Sprintf("names %s, which does not exist", p))
		}
	}
	return checked, errs
}

// row checks the exported names in backticks in a package table row's
// middle column against the row's packages.
func (c *code) row(r pkgRow) (checked int, errs []string) {
	var pkgs []*goPkg
	for _, p := range r.pkgs {
		if g := c.pkgs[p]; g != nil {
			pkgs = append(pkgs, g)
		}
	}
	for _, m := range codeSpan.FindAllStringSubmatch(r.owns, -1) {
		if !exported.MatchString(m[1]) {
			continue
		}
		checked++
		if !slices.ContainsFunc(pkgs, func(g *goPkg) bool { return g.has(c.pkgs, m[1]) }) {
			errs = append(errs, fmt.Sprintf("the row of %v names `%s`, which none of its packages declares", r.pkgs, m[1]))
		}
	}
	return checked, errs
}

// withFields lists sym and, for "{A, B: x}", sym.A and sym.B.
func withFields(sym, braces string) []string {
	out := []string{sym}
	if braces == "" || strings.Contains(sym, ".") {
		return out
	}
	for _, part := range strings.Split(strings.Trim(braces, "{}"), ",") {
		if m := fieldKey.FindStringSubmatch(strings.TrimSpace(part)); m != nil {
			out = append(out, sym+"."+m[1])
		}
	}
	return out
}

func dirs(gs []*goPkg) string {
	var out []string
	for _, g := range gs {
		out = append(out, g.dir)
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}
