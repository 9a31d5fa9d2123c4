package tarcheck_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/tarcheck"
)

// archive writes entries (header, body) as a real tar archive and reads
// it back: the headers a checker sees are what archive/tar makes of them.
func archive(t *testing.T, entries ...tar.Header) []*tar.Header {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(bytes.Repeat([]byte("x"), int(h.Size))); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return headers(t, &buf)
}

func headers(t *testing.T, r io.Reader) []*tar.Header {
	t.Helper()
	tr := tar.NewReader(r)
	var out []*tar.Header
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h)
	}
}

// run checks every header; it answers the error of the first refused one
// (its index) and the entries skipped.
func run(c *tarcheck.Checker, hs []*tar.Header) (int, error, []string) {
	var skipped []string
	for i, h := range hs {
		err := c.Check(h)
		if errors.Is(err, tarcheck.ErrSkip) {
			skipped = append(skipped, tarcheck.Rel(h.Name))
			continue
		}
		if err != nil {
			return i, err, skipped
		}
	}
	return -1, nil, skipped
}

func dir(name string) tar.Header { return tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: 0o755} }
func file(name string, size int64) tar.Header {
	return tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: size}
}
func symlink(name, to string) tar.Header {
	return tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: to, Mode: 0o777}
}
func hardlink(name, to string) tar.Header {
	return tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: to, Mode: 0o644}
}

// A root file system as the stemcell builder lays it out passes: absolute
// symlinks are data, hard links to earlier files are fine; device nodes
// and FIFOs are skipped.
func TestARootFileSystemPasses(t *testing.T) {
	hs := archive(t, dir("./"), dir("./usr/"), dir("./usr/bin/"), symlink("./bin", "usr/bin"),
		symlink("./etc/mtab", "/proc/self/mounts"), file("./usr/bin/busybox", 100), hardlink("./usr/bin/sh", "./usr/bin/busybox"),
		hardlink("./usr/bin/ash", "usr/bin/sh"), dir("./dev/"),
		tar.Header{Name: "./dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3},
		tar.Header{Name: "./run/initctl", Typeflag: tar.TypeFifo, Mode: 0o600})
	c := tarcheck.New(tarcheck.Limits{Bytes: 1 << 20, Entries: 100})
	if i, err, skipped := run(c, hs); err != nil || strings.Join(skipped, ",") != "dev/null,run/initctl" {
		t.Fatalf("entry %d: %v; skipped %v", i, err, skipped)
	}
	if c.Bytes() != 100 || c.Entries() != int64(len(hs)) {
		t.Errorf("charged %d bytes, %d entries; want 100, %d", c.Bytes(), c.Entries(), len(hs))
	}
	if got := tarcheck.Rel("./usr/bin/../bin/sh"); got != "usr/bin/sh" {
		t.Errorf("Rel = %q", got)
	}
}

// Every way out of the root the probe tried, and the planted-symlink
// routes: each refused as input, naming the entry (and the link).
func TestHostileEntriesAreRefusedByName(t *testing.T) {
	for _, tc := range []struct {
		name    string
		entries []tar.Header
		want    []string
	}{
		{"dot-dot", []tar.Header{file("./../../etc/cron.d/evil", 1)}, []string{`"./../../etc/cron.d/evil"`, "leaves"}},
		{"dot-dot inside", []tar.Header{file("a/../../x", 1)}, []string{`"a/../../x"`}},
		{"absolute", []tar.Header{file("/etc/shadow", 0)}, []string{`"/etc/shadow"`}},
		{"below a planted symlink", []tar.Header{symlink("evil", "/etc"), file("evil/file", 1)},
			[]string{`"evil/file"`, `symlink "evil"`}},
		{"deep below a planted symlink", []tar.Header{dir("a/"), symlink("a/evil", "/etc"), file("a/evil/cron.d/x", 1)},
			[]string{`"a/evil/cron.d/x"`, `symlink "a/evil"`}},
		{"onto a relative symlink out", []tar.Header{symlink("rel", "../../../tmp/x"), file("rel", 1)},
			[]string{`"rel"`, `symlink "rel"`}},
		{"a directory onto a symlink", []tar.Header{symlink("etc", "/etc"), dir("etc/")}, []string{`"etc/"`}},
		{"hard link through a planted symlink", []tar.Header{symlink("evil", "/etc"), hardlink("shadow", "evil/shadow")},
			[]string{`"shadow"`, `"evil/shadow"`, `symlink "evil"`}},
		{"hard link to a symlink", []tar.Header{symlink("s", "/etc/shadow"), hardlink("shadow", "s")}, []string{`"shadow"`, `symlink "s"`}},
		{"hard link out", []tar.Header{hardlink("./shadow", "../../../etc/shadow")}, []string{`"./shadow"`, "leaves"}},
		{"hard link absolute", []tar.Header{hardlink("./shadow", "/etc/shadow")}, []string{`"./shadow"`, "leaves"}},
		{"hard link to nothing of the archive", []tar.Header{hardlink("passwd", "etc/passwd")}, []string{`"passwd"`, "no earlier file"}},
		{"hard link to a skipped device", []tar.Header{{Name: "dev/sda", Typeflag: tar.TypeBlock, Devmajor: 8}, hardlink("disk", "dev/sda")},
			[]string{`"disk"`, "no earlier file"}},
		{"hard link to a directory", []tar.Header{dir("etc/"), hardlink("e", "etc")}, []string{`"e"`}},
		{"hard link to the root", []tar.Header{hardlink("r", ".")}, []string{`"r"`}},
		{"the root as a file", []tar.Header{file(".", 0)}, []string{"root"}},
		{"another type", []tar.Header{{Name: "g", Typeflag: tar.TypeXGlobalHeader, PAXRecords: map[string]string{"comment": "x"}}},
			[]string{"is not a file, directory or link"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			hs := archive(t, tc.entries...)
			i, err, _ := run(tarcheck.New(tarcheck.Limits{}), hs)
			if !errors.Is(err, driver.ErrInvalidInput) || i != len(hs)-1 {
				t.Fatalf("entry %d: %v; want the last entry refused as ErrInvalidInput", i, err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v; want it to name %s", err, w)
				}
			}
		})
	}
}

// The entry budget counts every header, skipped ones too.
func TestEntryBudget(t *testing.T) {
	entries := []tar.Header{dir("./")}
	for i := range 100 {
		entries = append(entries, tar.Header{Name: "p" + string(rune('a'+i%26)) + strings.Repeat("x", i/26), Typeflag: tar.TypeFifo})
	}
	hs := archive(t, entries...)
	i, err, _ := run(tarcheck.New(tarcheck.Limits{Entries: 100}), hs)
	if i != 100 || !errors.Is(err, driver.ErrInvalidInput) || !strings.Contains(err.Error(), "more than 100 entries (max_image_entries)") {
		t.Errorf("entry %d: %v; want the 101st refused naming max_image_entries", i, err)
	}
}

// Sparse files, as GNU tar writes them in both its formats: an archive of
// a few hundred bytes declaring 12 GiB is charged 12 GiB — what a copy
// writes — and refused under a 10 GiB limit before any byte is read.
func TestSparseFilesAreChargedTheirDeclaredSize(t *testing.T) {
	work := t.TempDir()
	big := filepath.Join(work, "root", "big")
	if err := os.MkdirAll(filepath.Dir(big), 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(big)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(12 << 30); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("end"), 12<<30-3); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, format := range []string{"posix", "gnu"} {
		t.Run(format, func(t *testing.T) {
			out := filepath.Join(work, format+".tar.gz")
			if b, err := exec.Command("tar", "--sparse", "--format="+format, "-czf", out, "-C", filepath.Join(work, "root"), ".").CombinedOutput(); err != nil {
				t.Fatalf("GNU tar: %v\n%s", err, b)
			}
			st, _ := os.Stat(out)
			if st.Size() > 4096 {
				t.Fatalf("the sparse archive is %d bytes; want a few hundred", st.Size())
			}
			in, _ := os.Open(out)
			defer in.Close()
			r := gunzip(t, in)
			tr := tar.NewReader(r)
			c := tarcheck.New(tarcheck.Limits{Bytes: 10 << 30, Entries: 100})
			for {
				h, err := tr.Next()
				if err != nil {
					t.Fatalf("reading the archive: %v (no entry refused)", err)
				}
				if err := c.Check(h); err != nil {
					if !errors.Is(err, driver.ErrInvalidInput) || !strings.Contains(err.Error(), "10240 MiB limit (max_image_mib)") ||
						!strings.Contains(err.Error(), "big") {
						t.Errorf("%v; want the sparse file refused naming it and max_image_mib", err)
					}
					return
				}
			}
		})
	}
}

// A gzip bomb declares its size like any file: charged before a byte is
// copied; past the room the destination has, the error is NoDiskSpace.
func TestByteBudgetAndRoom(t *testing.T) {
	c := tarcheck.New(tarcheck.Limits{Bytes: 1 << 30})
	if err := c.Check(&tar.Header{Name: "a", Typeflag: tar.TypeReg, Size: 1<<30 - 1}); err != nil {
		t.Fatal(err)
	}
	err := c.Check(&tar.Header{Name: "zeros", Typeflag: tar.TypeReg, Size: 4 << 30})
	if !errors.Is(err, driver.ErrInvalidInput) || !strings.Contains(err.Error(), `"zeros"`) || !strings.Contains(err.Error(), "1024 MiB limit") {
		t.Errorf("4 GiB past a 1 GiB limit: %v", err)
	}
	// Sizes near the int64 edge do not wrap the sum around.
	if err := c.Check(&tar.Header{Name: "huge", Typeflag: tar.TypeReg, Size: 1<<63 - 1}); !errors.Is(err, driver.ErrInvalidInput) {
		t.Errorf("a size of 2^63-1: %v", err)
	}
	if err := c.Check(&tar.Header{Name: "neg", Typeflag: tar.TypeReg, Size: -1}); !errors.Is(err, driver.ErrInvalidInput) {
		t.Errorf("a negative size: %v", err)
	}
	// Header-only types charge nothing, whatever size they declare.
	if err := c.Check(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "a", Size: 8 << 30}); err != nil {
		t.Errorf("a symlink declaring 8 GiB: %v", err)
	}
	room := tarcheck.New(tarcheck.Limits{Bytes: 10 << 30, Room: 64 << 20})
	err = room.Check(&tar.Header{Name: "big", Typeflag: tar.TypeReg, Size: 65 << 20})
	if !errors.Is(err, driver.ErrNoDiskSpace) || errors.Is(err, driver.ErrInvalidInput) || !strings.Contains(err.Error(), `"big"`) {
		t.Errorf("past the room: %v; want ErrNoDiskSpace naming the entry", err)
	}
}

// Copy stops with its context, whatever the source still has.
func TestCopyStopsWithTheContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	w := &cancelAfter{n: 3 << 20, cancel: cancel}
	n, err := tarcheck.Copy(ctx, w, zeros{})
	if !errors.Is(err, context.Canceled) || n > 4<<20 {
		t.Errorf("copied %d bytes, %v; want context.Canceled within a chunk of the cancel", n, err)
	}
	var buf bytes.Buffer
	if n, err := tarcheck.Copy(context.Background(), &buf, strings.NewReader("content")); n != 7 || err != nil || buf.String() != "content" {
		t.Errorf("copy: %d, %v, %q", n, err, buf.String())
	}
}

func gunzip(t *testing.T, r io.Reader) io.Reader {
	t.Helper()
	zr, err := gzip.NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	return zr
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// cancelAfter cancels once n bytes were written to it.
type cancelAfter struct {
	n      int
	cancel func()
}

func (w *cancelAfter) Write(p []byte) (int, error) {
	w.n -= len(p)
	if w.n <= 0 {
		w.cancel()
	}
	return len(p), nil
}
