// Package rootfs writes small root file system tarballs for tests: the
// host's static busybox and its applets, plus files a test adds — a heavy
// stemcell's image, as the stemcell builder's rootfs tarballs are laid out
// ("./"-relative names, gzip).
package rootfs

import (
	"archive/tar"
	"compress/gzip"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
)

// Busybox is where Debian's busybox-static installs its static binary.
const Busybox = "/bin/busybox"

// Entry is one extra archive entry (a hostile test's, say).
type Entry struct {
	Header tar.Header
	Body   []byte
}

// Write writes dst: busybox at /bin with every applet linked to it,
// /etc/passwd (root, nobody, uid 1000), /tmp; then files (path in the
// image → host file, made executable) and extra entries, in that order.
func Write(dst string, files map[string]string, extra ...Entry) error {
	bb, err := os.ReadFile(Busybox)
	if err != nil {
		return fmt.Errorf("rootfs: %w (apt-get install busybox-static)", err)
	}
	out, err := exec.Command(Busybox, "--list").Output()
	if err != nil {
		return fmt.Errorf("rootfs: busybox --list: %w", err)
	}
	entries := []Entry{
		{Header: tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755}},
		{Header: tar.Header{Name: "./bin/", Typeflag: tar.TypeDir, Mode: 0o755}},
		{Header: tar.Header{Name: "./etc/", Typeflag: tar.TypeDir, Mode: 0o755}},
		{Header: tar.Header{Name: "./tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}},
		{Header: tar.Header{Name: "./bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755}, Body: bb},
		{Header: tar.Header{Name: "./etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644},
			Body: []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/sh\nvcap:x:1000:1000::/tmp:/bin/sh\n")},
	}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" {
			entries = append(entries, Entry{Header: tar.Header{Name: "./bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777}})
		}
	}
	return archive(dst, nil, entries, files, extra)
}

// Extend writes dst: the rootfs tarball src (gzip), then files (path in
// the image → host file, made executable).
func Extend(dst, src string, files map[string]string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	gz, err := gzip.NewReader(in)
	if err != nil {
		return err
	}
	return archive(dst, tar.NewReader(gz), nil, files, nil)
}

// archive writes dst (gzip): base's entries (when base is not nil), then
// before, files and after, in that order.
func archive(dst string, base *tar.Reader, before []Entry, files map[string]string, after []Entry) error {
	f, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer f.Close()
	zw, _ := gzip.NewWriterLevel(f, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	for base != nil {
		h, err := base.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, base); err != nil {
			return err
		}
	}
	entries := slices.Clone(before)
	for _, name := range slices.Sorted(maps.Keys(files)) {
		body, err := os.ReadFile(files[name])
		if err != nil {
			return err
		}
		entries = append(entries, Entry{Header: tar.Header{Name: "." + name, Typeflag: tar.TypeReg, Mode: 0o755}, Body: body})
	}
	for _, e := range append(entries, after...) {
		h := e.Header
		h.Size = int64(len(e.Body))
		if err := tw.WriteHeader(&h); err != nil {
			return err
		}
		if _, err := tw.Write(e.Body); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := zw.Close(); err != nil {
		return err
	}
	return f.Close()
}
