package kubernetes

// Heavy stemcells as the probe of issue 37 (item 7) sent them: tiny
// archives declaring huge layers, too many entries, entries through a
// planted symlink, and a copy nothing could stop.

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/rpc"
	"github.com/runway-cpi/runway/src/testkit/rootfs"
)

// sparseTarball writes a gzip tarball (GNU tar --sparse, PAX format) of
// one file of size bytes that are almost all a hole: a few hundred bytes.
func sparseTarball(t *testing.T, size int64) string {
	t.Helper()
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	if err := os.Mkdir(root, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(root, "big"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out := filepath.Join(dir, "sparse.tgz")
	if b, err := exec.Command("tar", "--sparse", "--format=posix", "-czf", out, "-C", root, ".").CombinedOutput(); err != nil {
		t.Fatalf("GNU tar: %v\n%s", err, b)
	}
	return out
}

// gzipBomb writes a tarball of one file of size zero bytes (a multiple
// of 64 MiB) as a bomb is made: one gzip member of 64 MiB of zeros,
// repeated (gzip readers read concatenated members as one stream).
func gzipBomb(t *testing.T, size int64) string {
	t.Helper()
	var hdr bytes.Buffer
	tw := tar.NewWriter(&hdr)
	if err := tw.WriteHeader(&tar.Header{Name: "./zeros", Typeflag: tar.TypeReg, Mode: 0o644, Size: size}); err != nil {
		t.Fatal(err)
	}
	member := func(b []byte) []byte {
		var out bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&out, gzip.BestCompression)
		zw.Write(b)
		zw.Close()
		return out.Bytes()
	}
	zeros := member(make([]byte, 64<<20))
	path := filepath.Join(t.TempDir(), "bomb.tgz")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.Write(member(hdr.Bytes()))
	for range size / (64 << 20) {
		f.Write(zeros)
	}
	f.Write(member(make([]byte, 1024))) // the archive's end
	return path
}

// manyEntries writes a tarball of n empty files.
func manyEntries(t *testing.T, n int) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "many.tgz")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	for i := range n {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("./f%06d", i), Typeflag: tar.TypeReg, Mode: 0o644}); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	zw.Close()
	return path
}

// leftLayers are the layer files left in dir (the driver's TMPDIR).
func leftLayers(t *testing.T, dir string) []string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(dir, "runway-layer-*"))
	return m
}

// A 270-byte tarball was pushed as a 12 GiB layer, a 4 MB one as a layer
// holding a 4 GiB file, 200,000 entries were taken: now the local
// driver's budget holds (max_image_mib, default 10 GiB, charged by the
// size each entry declares; max_image_entries, default 150,000), at once,
// with nothing pushed and no layer file left.
func TestHeavyStemcellBudget(t *testing.T) {
	c := devCluster(t)
	reg, repo := devRegistry(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx := context.Background()
	before := len(tags(t, repo))
	capped := map[string]any{"max_image_mib": 1024}
	for k, v := range reg {
		capped[k] = v
	}
	for _, tc := range []struct {
		name, image string
		cfg         map[string]any
		want        string
	}{
		{"12 GiB declared by a sparse file", sparseTarball(t, 12<<30), reg, "10240 MiB limit (max_image_mib)"},
		{"a gzip bomb of 4 GiB", gzipBomb(t, 4<<30), capped, "1024 MiB limit (max_image_mib)"},
		{"200,000 entries", manyEntries(t, 200000), reg, "more than 150000 entries (max_image_entries)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, _ := os.Stat(tc.image)
			d := newTestDriver(t, c, tc.cfg)
			started := time.Now()
			_, err := d.CreateStemcell(ctx, driver.StemcellSpec{ImagePath: tc.image, CloudProps: driver.PropsOf(map[string]any{})})
			if !errors.Is(err, driver.ErrInvalidInput) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("create_stemcell of a %d-byte tarball: %v; want ErrInvalidInput naming %q", st.Size(), err, tc.want)
			}
			t.Logf("create_stemcell of a %d-byte tarball answered in %s", st.Size(), time.Since(started).Round(time.Millisecond))
			if left := leftLayers(t, tmp); len(left) > 0 {
				t.Errorf("layer files left: %v", left)
			}
		})
	}
	if n := len(tags(t, repo)); n != before {
		t.Errorf("%d tags after refused uploads, want %d", n, before)
	}
}

// Entries through a symlink the archive planted went into the layer as
// they were. Now each is refused by name, nothing pushed.
func TestPlantedSymlinksAreRefused(t *testing.T) {
	c := devCluster(t)
	reg, repo := devRegistry(t)
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	d := newTestDriver(t, c, reg)
	before := len(tags(t, repo))
	link := func(name, to string) rootfs.Entry {
		return rootfs.Entry{Header: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: to, Mode: 0o777}}
	}
	file := func(name string) rootfs.Entry {
		return rootfs.Entry{Header: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644}, Body: []byte("planted\n")}
	}
	for _, tc := range []struct {
		name    string
		entries []rootfs.Entry
		want    []string
	}{
		{"evil -> /etc, then evil/file", []rootfs.Entry{link("./evil", "/etc"), file("./evil/file")}, []string{`"./evil/file"`, `symlink "evil"`}},
		{"rel -> ../../../tmp/x, then a file onto it", []rootfs.Entry{link("./rel", "../../../tmp/x"), file("./rel")}, []string{`"./rel"`, `symlink "rel"`}},
		{"rel -> ../../../tmp/x, then a file below it", []rootfs.Entry{link("./rel", "../../../tmp/x"), file("./rel/file")}, []string{`"./rel/file"`, `symlink "rel"`}},
		{"a hard link to /etc/shadow through a link", []rootfs.Entry{link("./evil", "/etc"),
			{Header: tar.Header{Name: "./shadow", Typeflag: tar.TypeLink, Linkname: "./evil/shadow"}}}, []string{`"./shadow"`, `symlink "evil"`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			img := filepath.Join(t.TempDir(), "image")
			if err := rootfs.Write(img, nil, tc.entries...); err != nil {
				t.Fatal(err)
			}
			_, err := d.CreateStemcell(context.Background(), driver.StemcellSpec{ImagePath: img, CloudProps: driver.PropsOf(map[string]any{})})
			if !errors.Is(err, driver.ErrInvalidInput) {
				t.Fatalf("create_stemcell: %v; want ErrInvalidInput", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("create_stemcell: %v; want it to name %s", err, w)
				}
			}
		})
	}
	if n := len(tags(t, repo)); n != before {
		t.Errorf("%d tags after refused uploads, want %d", n, before)
	}
	if left := leftLayers(t, tmp); len(left) > 0 {
		t.Errorf("layer files left: %v", left)
	}
}

// Nothing stopped a stemcell's copy. bin/cpi, as the Director runs it,
// gets SIGTERM while it writes a 9 GiB layer (within the 10 GiB budget):
// the copy stops with the call (its answer is the driver's, not "ended
// without waiting"), no layer file is left and nothing is pushed.
func TestCreateStemcellStopsWithTheCall(t *testing.T) {
	c := devCluster(t)
	reg, repo := devRegistry(t)
	before := len(tags(t, repo))
	image := sparseTarball(t, 9<<30)
	cpi := cpiCaller(t, c, reg)
	tmp := t.TempDir()
	req, _ := json.Marshal(map[string]any{"method": "create_stemcell", "api_version": 2, "arguments": []any{image, map[string]any{}},
		"context": map[string]any{"director_uuid": "sigterm-director"}})
	cmd := exec.Command(cpi.Bin, "-configPath", cpi.Config)
	cmd.Env = append(os.Environ(), "TMPDIR="+tmp)
	cmd.Stdin = bytes.NewReader(req)
	var out bytes.Buffer
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// The copy is under way once its layer file is there.
	for deadline := time.Now().Add(30 * time.Second); len(leftLayers(t, tmp)) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatal("no layer file appeared within 30 s")
		}
	}
	termed := time.Now()
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("bin/cpi: %v", err)
	}
	took := time.Since(termed)
	r, err := rpc.ParseReply(out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if r.Error == nil || !strings.Contains(r.Error.Message, "interrupted") || strings.Contains(r.Error.Message, "without waiting") {
		t.Errorf("create_stemcell after SIGTERM: %+v; want the driver's own answer to the interruption", r.Error)
	}
	if took > 2*time.Second {
		t.Errorf("bin/cpi took %s after SIGTERM", took)
	}
	if left := leftLayers(t, tmp); len(left) > 0 {
		t.Errorf("layer files left: %v", left)
	}
	if n := len(tags(t, repo)); n != before {
		t.Errorf("%d tags after an interrupted upload, want %d", n, before)
	}
}
