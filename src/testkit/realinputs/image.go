package realinputs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"os"
	"path/filepath"
	"testing"
)

// StemcellImage writes the "image" file of a heavy stemcell as the
// stemcell builder packs it for OpenStack and AWS (a gzipped tar holding
// root.img) with content as the disk, and returns its path: what the
// Director hands create_stemcell after unpacking the stemcell tarball.
func StemcellImage(t testing.TB, content []byte) string {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	if err := tw.WriteHeader(&tar.Header{Name: "root.img", Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write(content)
	tw.Close()
	gz.Close()
	p := filepath.Join(t.TempDir(), "image")
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
