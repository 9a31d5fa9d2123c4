package rootfs

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"testing"
)

// Extend keeps every entry of the tarball it extends, in order, and adds
// each file after them, executable, with the file's bytes.
func TestExtendKeepsTheBaseAndAddsTheFiles(t *testing.T) {
	dir := t.TempDir()
	base, out, prog := filepath.Join(dir, "base.tgz"), filepath.Join(dir, "out.tgz"), filepath.Join(dir, "prog")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\necho runner\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := Write(base, nil, Entry{Header: tar.Header{Name: "./etc/marker", Typeflag: tar.TypeReg, Mode: 0o644}, Body: []byte("m")}); err != nil {
		t.Fatal(err)
	}
	if err := Extend(out, base, map[string]string{"/usr/local/bin/runner": prog}); err != nil {
		t.Fatal(err)
	}
	was, now := read(t, base), read(t, out)
	if len(now) != len(was)+1 {
		t.Fatalf("%d entries, want the base's %d and one more", len(now), len(was))
	}
	for i, e := range was {
		if now[i].Name != e.Name || now[i].Mode != e.Mode || now[i].body != e.body {
			t.Errorf("entry %d: %s %o, want the base's %s %o", i, now[i].Name, now[i].Mode, e.Name, e.Mode)
		}
	}
	if last := now[len(now)-1]; last.Name != "./usr/local/bin/runner" || last.Mode != 0o755 || last.body != "#!/bin/sh\necho runner\n" {
		t.Errorf("added %s %o %q; want ./usr/local/bin/runner 755 with the file's bytes", last.Name, last.Mode, last.body)
	}
}

type entry struct {
	tar.Header
	body string
}

func read(t *testing.T, path string) []entry {
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var out []entry
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		out = append(out, entry{*h, string(b)})
	}
}
