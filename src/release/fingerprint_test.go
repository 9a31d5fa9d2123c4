package release

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The fixture's fingerprints as the real bosh CLI (v7, built from
// cloudfoundry/bosh-cli 19ee1a8d9) computed them with `bosh create-release
// --force` on a git checkout of testdata/fixture: an executable, a plain
// file, a symlink, a dependency and a job with templates. Equal
// fingerprints mean either tool recognises the other's builds.
var boshFingerprints = map[string]string{
	"alpha": "5bd83df4a02e8856786f702e2592862e38cb05773bf9da7b1295d740ee99a367",
	"beta":  "83cd5e6e71d8b5393554bd9722633fb52bf79a29b9f46362c8169215122308e9",
	"web":   "5dc9df3ce6e9d0ed80f69ac85e5f011d54cae2ba815304616409dfca36f11bc2",
}

func TestFingerprintsEqualTheBoshCLIs(t *testing.T) {
	r, err := Read("testdata/fixture")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, a := range append(r.Packages, r.Jobs...) {
		got[a.Name] = a.Fingerprint
	}
	for name, want := range boshFingerprints {
		if got[name] != want {
			t.Errorf("%s: fingerprint %s, bosh-cli's is %s", name, got[name], want)
		}
	}
}

// A change in content, mode or dependencies changes the fingerprint.
func TestFingerprintFollowsContentModeAndDependencies(t *testing.T) {
	dir := copyFixture(t)
	base := fingerprints(t, dir)
	for name, change := range map[string]func(){
		"content": func() { os.WriteFile(filepath.Join(dir, "src/alpha/data.txt"), []byte("other\n"), 0o644) },
		"mode":    func() { os.Chmod(filepath.Join(dir, "src/alpha/data.txt"), 0o755) },
		"deps": func() {
			os.WriteFile(filepath.Join(dir, "packages/beta/spec"), []byte("name: beta\nfiles: [beta/data.txt, beta/link]\n"), 0o644)
		},
	} {
		t.Run(name, func(t *testing.T) {
			dir = copyFixture(t)
			change()
			after := fingerprints(t, dir)
			pkg := map[string]string{"content": "alpha", "mode": "alpha", "deps": "beta"}[name]
			if after[pkg] == base[pkg] {
				t.Errorf("%s change kept %s's fingerprint %s", name, pkg, base[pkg])
			}
		})
	}
}

func TestReadRefusesBrokenReleases(t *testing.T) {
	for name, tc := range map[string]struct {
		change func(dir string)
		want   string
	}{
		"missing monit":     {func(d string) { os.Remove(filepath.Join(d, "jobs/web/monit")) }, "monit is missing"},
		"missing packaging": {func(d string) { os.Remove(filepath.Join(d, "packages/alpha/packaging")) }, "packaging is missing"},
		"unmatched file":    {func(d string) { os.Remove(filepath.Join(d, "src/beta/data.txt")) }, `no file in src/ or blobs/ matches "beta/data.txt"`},
		"unknown dependency": {func(d string) {
			os.WriteFile(filepath.Join(d, "packages/beta/spec"), []byte("name: beta\ndependencies: [gamma]\nfiles: [beta/data.txt]\n"), 0o644)
		}, "depends on gamma"},
		"cycle": {func(d string) {
			os.WriteFile(filepath.Join(d, "packages/alpha/spec"), []byte("name: alpha\ndependencies: [beta]\nfiles: [alpha/*]\n"), 0o644)
		}, "package dependency cycle"},
		"job uses unknown package": {func(d string) {
			os.WriteFile(filepath.Join(d, "jobs/web/spec"), []byte("name: web\npackages: [nope]\n"), 0o644)
		}, "uses package nope"},
		"missing template": {func(d string) { os.Remove(filepath.Join(d, "jobs/web/templates/conf.erb")) }, "template"},
	} {
		t.Run(name, func(t *testing.T) {
			dir := copyFixture(t)
			tc.change(dir)
			_, err := Read(dir)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Read: %v; want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestOrderPutsDependenciesFirst(t *testing.T) {
	r, err := Read("testdata/fixture")
	if err != nil {
		t.Fatal(err)
	}
	order, err := r.Order()
	if err != nil {
		t.Fatal(err)
	}
	if len(order) != 2 || order[0].Name != "alpha" || order[1].Name != "beta" {
		t.Fatalf("order %v", names(order))
	}
}

// A final release puts each new archive into the blobstore once; the next
// final release reuses them (checking their digests), numbers itself one
// higher, and a blob that changed in the blobstore is refused.
func TestFinalReleasesShareBlobs(t *testing.T) {
	dir := copyFixture(t)
	blobs := t.TempDir()
	r, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	v, _ := r.NextFinalVersion()
	m1, err := r.Build(Options{Version: v, Final: true, Blobstore: blobs, Tarball: filepath.Join(t.TempDir(), "r1.tgz")})
	if err != nil {
		t.Fatal(err)
	}
	if v != "1" || countFiles(t, blobs) != 3 {
		t.Fatalf("first final: version %s, %d blobs", v, countFiles(t, blobs))
	}
	if _, err := os.Stat(filepath.Join(dir, "releases/fixture/fixture-1.yml")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Build(Options{Version: "1", Final: true, Blobstore: blobs}); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("a second final release 1: %v", err)
	}
	// A change to one job: one new blob, the packages reused.
	os.WriteFile(filepath.Join(dir, "jobs/web/templates/conf.erb"), []byte("port=<%= p(\"web.port\") %> # v2\n"), 0o644)
	r, _ = Read(dir)
	v, _ = r.NextFinalVersion()
	m2, err := r.Build(Options{Version: v, Final: true, Blobstore: blobs, Tarball: filepath.Join(t.TempDir(), "r2.tgz")})
	if err != nil {
		t.Fatal(err)
	}
	if v != "2" || countFiles(t, blobs) != 4 || m2.Packages[0].SHA1 != m1.Packages[0].SHA1 || m2.Jobs[0].SHA1 == m1.Jobs[0].SHA1 {
		t.Fatalf("second final: version %s, %d blobs\n%+v\n%+v", v, countFiles(t, blobs), m1, m2)
	}
	// Tamper with every blob: a reused build is checked.
	entries, _ := os.ReadDir(blobs)
	for _, e := range entries {
		os.WriteFile(filepath.Join(blobs, e.Name()), []byte("tampered"), 0o644)
	}
	if _, err := r.Build(Options{Version: "3", Final: true, Blobstore: blobs}); err == nil || !strings.Contains(err.Error(), "the index says") {
		t.Fatalf("tampered blobstore: %v", err)
	}
}

func copyFixture(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "fixture")
	if out, err := exec.Command("cp", "-a", "testdata/fixture", dir).CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	return dir
}

func fingerprints(t *testing.T, dir string) map[string]string {
	t.Helper()
	r, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, a := range append(r.Packages, r.Jobs...) {
		out[a.Name] = a.Fingerprint
	}
	return out
}

func countFiles(t *testing.T, dir string) int {
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return len(entries)
}

func names(as []*Artifact) []string {
	var out []string
	for _, a := range as {
		out = append(out, a.Name)
	}
	return out
}
