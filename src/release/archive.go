package release

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// entry is one member of an archive: a file from disk or bytes.
type entry struct {
	name string // slash-separated, relative
	path string // read from here when data is nil
	data []byte
	mode int64
}

// writeTGZ writes a gzipped tar of entries, reproducibly: sorted names,
// every parent directory listed, fixed times and owners, no gzip header
// time. The same inputs give the same bytes, so archive SHA-1s (and the
// blobs of a final release) do not change between builds of one commit.
func writeTGZ(w io.Writer, entries []entry) error {
	gz, err := gzip.NewWriterLevel(w, gzip.BestCompression)
	if err != nil {
		return err
	}
	tw := tar.NewWriter(gz)
	sort.Slice(entries, func(i, j int) bool { return entries[i].name < entries[j].name })
	dirs := map[string]bool{}
	epoch := time.Unix(0, 0)
	hdr := func(name string, typ byte, mode, size int64) *tar.Header {
		return &tar.Header{Name: name, Typeflag: typ, Mode: mode, Size: size, ModTime: epoch, Uname: "root", Gname: "root", Format: tar.FormatPAX}
	}
	if err := tw.WriteHeader(hdr("./", tar.TypeDir, 0o755, 0)); err != nil {
		return err
	}
	for _, e := range entries {
		parts := strings.Split(e.name, "/")
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/") + "/"
			if !dirs[d] {
				dirs[d] = true
				if err := tw.WriteHeader(hdr("./"+d, tar.TypeDir, 0o755, 0)); err != nil {
					return err
				}
			}
		}
		data := e.data
		if data == nil {
			// Follow links: what the link points at is what gets packaged.
			if data, err = os.ReadFile(e.path); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(hdr("./"+e.name, tar.TypeReg, e.mode, int64(len(data)))); err != nil {
			return err
		}
		if _, err := tw.Write(data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return gz.Close()
}

// fileMode is the mode a file keeps in an archive: executable or not.
func fileMode(path string) (int64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	if st.Mode()&0o111 != 0 {
		return 0o755, nil
	}
	return 0o644, nil
}

// archive writes a's archive into dir/<name>.tgz and answers its path and
// digest.
func (a *Artifact) archive(dir string) (string, string, error) {
	var entries []entry
	for _, f := range a.Files {
		mode, err := fileMode(f.Path)
		if err != nil {
			return "", "", err
		}
		entries = append(entries, entry{name: f.Name, path: f.Path, mode: mode})
	}
	path := filepath.Join(dir, a.Name+".tgz")
	if err := writeFile(path, func(w io.Writer) error { return writeTGZ(w, entries) }); err != nil {
		return "", "", fmt.Errorf("archiving %s: %w", a.Name, err)
	}
	sum, err := digestFile(path)
	return path, sum, err
}

// writeFile writes path through a temporary file and a rename, so a killed
// build never leaves half an archive under the final name.
func writeFile(path string, fill func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := fill(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
