package catalog_test

import (
	"encoding/json"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/runway-cpi/runway/src/driver"
	_ "github.com/runway-cpi/runway/src/driver/aws"
	"github.com/runway-cpi/runway/src/driver/catalog"
	_ "github.com/runway-cpi/runway/src/driver/kubernetes"
	_ "github.com/runway-cpi/runway/src/driver/local"
	_ "github.com/runway-cpi/runway/src/driver/openstack"
	_ "github.com/runway-cpi/runway/src/driver/vsphere"
)

const module = "github.com/runway-cpi/runway/"

// root is the repository (tests run in their package's directory).
func root(t *testing.T) string {
	dir, err := filepath.Abs("../../..")
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// The table is the drivers: each row has its package, which registers
// that name and whose formats info answers, and its executable's main
// package, which links exactly that driver; there is no driver package
// or executable outside the table.
func TestTableIsTheDrivers(t *testing.T) {
	top := root(t)
	if got, want := driver.Names(), catalog.Names(); !slices.Equal(got, want) {
		t.Errorf("registered drivers %v, table %v", got, want)
	}
	if !slices.IsSorted(catalog.Names()) {
		t.Errorf("the table is not in name order: %v", catalog.Names())
	}
	for _, d := range catalog.Drivers {
		imports := mainImports(t, filepath.Join(top, d.Main()))
		pkg := module + "src/driver/" + d.Name
		var drivers []string
		for _, p := range imports {
			if filepath.Dir(p) == module+"src/driver" && p != module+"src/driver/catalog" {
				drivers = append(drivers, p)
			}
		}
		if !slices.Equal(drivers, []string{pkg}) {
			t.Errorf("%s links drivers %v, want exactly %s", d.Main(), drivers, pkg)
		}
		if f, ok := catalog.Answered(d.Name, json.RawMessage("{}")); !ok || !slices.Equal(f, d.StemcellFormats) || len(f) == 0 {
			t.Errorf("%s: info would answer %v", d.Name, f)
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(top, "src/cmd/cpi-*"))
	for _, dir := range dirs {
		if name := filepath.Base(dir)[len("cpi-"):]; !slices.Contains(catalog.Names(), name) {
			t.Errorf("src/cmd/%s is not in the driver table", filepath.Base(dir))
		}
	}
	dirs, _ = filepath.Glob(filepath.Join(top, "src/driver/*"))
	for _, dir := range dirs {
		name := filepath.Base(dir)
		// Support code the drivers share: the table, the conformance
		// suite, the tarball checks, the helpers that are no driver's.
		support := []string{"catalog", "drivertest", "tarcheck", "poll", "cloudtags", "stemcellmf", "stemcellimage", "agentprofile", "netprefix", "clouddeps", "found", "statecache"}
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || slices.Contains(support, name) {
			continue
		}
		if !slices.Contains(catalog.Names(), name) {
			t.Errorf("src/driver/%s is neither a driver in the table nor support code known here", name)
		}
	}
}

func mainImports(t *testing.T, dir string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join(dir, "main.go"), nil, parser.ImportsOnly)
	if err != nil {
		t.Fatalf("the driver's executable: %v", err)
	}
	var out []string
	for _, im := range f.Imports {
		p, _ := strconv.Unquote(im.Path.Value)
		out = append(out, p)
	}
	return out
}

// The local section's stemcell_formats replace the table's.
func TestAnsweredFormatsKey(t *testing.T) {
	f, ok := catalog.Answered("local", json.RawMessage(`{"stemcell_formats": ["warden-tar"]}`))
	if !ok || !slices.Equal(f, []string{"warden-tar"}) {
		t.Errorf("local with stemcell_formats: %v %v", f, ok)
	}
	if f, _ := catalog.Answered("aws", json.RawMessage(`{"stemcell_formats": ["x"]}`)); !slices.Equal(f, catalog.Formats("aws")) {
		t.Errorf("aws took stemcell_formats: %v", f)
	}
	if _, ok := catalog.Answered("no-such-driver", nil); ok {
		t.Error("an unknown driver answered")
	}
}

// A kubernetes section with a registry takes rootfs stemcells too; the
// table's own row is left as it was.
func TestAnsweredExtraKey(t *testing.T) {
	f, _ := catalog.Answered("kubernetes", json.RawMessage(`{"namespace": "x", "registry": {"repository": "r.example/s"}}`))
	if !slices.Contains(f, "warden-tar") || !slices.Contains(f, "kubernetes-light") {
		t.Errorf("kubernetes with a registry: %v", f)
	}
	for _, section := range []string{`{"namespace": "x"}`, `{"registry": null}`} {
		if f, _ := catalog.Answered("kubernetes", json.RawMessage(section)); slices.Contains(f, "warden-tar") {
			t.Errorf("kubernetes %s: %v; want no warden-tar", section, f)
		}
	}
	if slices.Contains(catalog.Formats("kubernetes"), "warden-tar") {
		t.Error("Answered changed the table")
	}
}
