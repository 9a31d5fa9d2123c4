package storage

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/driver"
)

func TestUnescapeMount(t *testing.T) {
	if got := UnescapeMount(`/tmp/a\040b/c\134d`); got != `/tmp/a b/c\d` {
		t.Errorf("got %q", got)
	}
}

func TestUntarRootfsKeepsOwnersModesAndHardLinks(t *testing.T) {
	// Another owner takes root (as container mode does); otherwise one's own.
	owner := os.Getuid()
	if owner == 0 {
		owner = 1000
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body string) {
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	add(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	add(&tar.Header{Name: "./tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}, "")
	add(&tar.Header{Name: "./usr/bin/su", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: os.Getuid(), Gid: os.Getgid()}, "su")
	add(&tar.Header{Name: "./home/u/f", Typeflag: tar.TypeReg, Mode: 0o640, Uid: owner, Gid: owner}, "f")
	add(&tar.Header{Name: "./usr/bin/su2", Typeflag: tar.TypeLink, Linkname: "./usr/bin/su"}, "")
	add(&tar.Header{Name: "./dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}, "")
	tw.Close()
	dir := t.TempDir()
	src := filepath.Join(dir, "rootfs.tar")
	os.WriteFile(src, buf.Bytes(), 0o600)
	budget := &Budget{room: 1 << 30}
	dst := filepath.Join(dir, "root")
	if err := Untar(context.Background(), src, dst, budget, true); err != nil {
		t.Fatal(err)
	}
	st := func(p string) (os.FileInfo, *syscall.Stat_t) {
		fi, err := os.Lstat(filepath.Join(dst, p))
		if err != nil {
			t.Fatal(err)
		}
		return fi, fi.Sys().(*syscall.Stat_t)
	}
	// The root's own mode too: a 0700 root (the staging directory's)
	// keeps every user but root out of the VM.
	if fi, _ := st("."); fi.Mode().Perm() != 0o755 {
		t.Errorf("image root mode %v", fi.Mode())
	}
	if fi, _ := st("tmp"); fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("/tmp mode %v", fi.Mode())
	}
	if fi, _ := st("usr/bin/su"); fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("su mode %v", fi.Mode())
	}
	if _, s := st("home/u/f"); int(s.Uid) != owner || int(s.Gid) != owner {
		t.Errorf("owner %d:%d", s.Uid, s.Gid)
	}
	_, a := st("usr/bin/su")
	_, b := st("usr/bin/su2")
	if a.Ino != b.Ino {
		t.Error("hard link unpacked as a copy")
	}
	if _, err := os.Lstat(filepath.Join(dst, "dev/null")); err == nil {
		t.Error("a device node was made (the runtime makes /dev)")
	}
	// Outside rootfs mode a device is refused, as before.
	if err := Untar(context.Background(), src, filepath.Join(dir, "plain"), &Budget{room: 1 << 30}, false); err == nil {
		t.Error("a device entry was accepted for a plain image")
	}
}

// hostileEntry is one tar entry of a hostile archive.
type hostileEntry struct {
	h    tar.Header
	body string
}

func writeTar(t *testing.T, entries ...hostileEntry) string {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		e.h.Size = int64(len(e.body))
		if e.h.Mode == 0 {
			e.h.Mode = 0o644
		}
		if err := tw.WriteHeader(&e.h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(e.body))
	}
	tw.Close()
	src := filepath.Join(t.TempDir(), "image.tar")
	os.WriteFile(src, buf.Bytes(), 0o600)
	return src
}

// Whatever an image's entries say, nothing outside the image directory is
// made, changed or linked to: every case below had a host directory and
// file beside the image, which must come out as they went in.
func TestUntarKeepsHostileArchivesInsideTheImage(t *testing.T) {
	host := t.TempDir()
	hostFile := filepath.Join(host, "shadow")
	os.WriteFile(hostFile, []byte("host"), 0o600)
	os.Chmod(host, 0o700)
	dir := func(name string, mode int64) hostileEntry {
		return hostileEntry{h: tar.Header{Name: name, Typeflag: tar.TypeDir, Mode: mode}}
	}
	file := func(name, body string) hostileEntry {
		return hostileEntry{h: tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o4777}, body: body}
	}
	link := func(name, target string) hostileEntry {
		return hostileEntry{h: tar.Header{Name: name, Typeflag: tar.TypeSymlink, Linkname: target}}
	}
	hard := func(name, target string) hostileEntry {
		return hostileEntry{h: tar.Header{Name: name, Typeflag: tar.TypeLink, Linkname: target}}
	}
	for name, c := range map[string]struct {
		entries []hostileEntry
		want    string
	}{
		"symlink then dir":         {[]hostileEntry{link("evil", host), dir("evil", 0o3777)}, `"evil" lies on or below symlink "evil"`},
		"symlink then file":        {[]hostileEntry{link("evil", hostFile), file("evil", "pwned")}, `"evil" lies on or below symlink "evil"`},
		"symlink then file below":  {[]hostileEntry{link("evil", host), file("evil/planted", "pwned")}, `lies on or below symlink "evil"`},
		"relative symlink out":     {[]hostileEntry{link("up", "../../../../../../.."+host), file("up/planted", "x")}, "symlink"},
		"symlink in a subdir":      {[]hostileEntry{dir("etc", 0o755), link("etc/d", host), dir("etc/d", 0o777)}, `symlink "etc/d"`},
		"hard link out":            {[]hostileEntry{hard("evil", "../../etc/shadow")}, "escapes"},
		"hard link absolute":       {[]hostileEntry{hard("evil", hostFile)}, "escapes"},
		"hard link through a link": {[]hostileEntry{link("s", host), hard("h", "s/shadow")}, "points through symlink"},
		"absolute name":            {[]hostileEntry{file(host+"/planted", "x")}, "escapes"},
		"dot-dot name":             {[]hostileEntry{file("a/../../planted", "x")}, "escapes"},
	} {
		t.Run(name, func(t *testing.T) {
			err := Untar(context.Background(), writeTar(t, c.entries...), filepath.Join(t.TempDir(), "root"), &Budget{room: 1 << 30}, true)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v; want it to say %q", err, c.want)
			}
			if fi, _ := os.Stat(host); fi.Mode().Perm() != 0o700 || fi.Mode()&(os.ModeSetgid|os.ModeSticky) != 0 {
				t.Errorf("the host directory's mode changed: %v", fi.Mode())
			}
			if b, _ := os.ReadFile(hostFile); string(b) != "host" {
				t.Errorf("the host file was written: %q", b)
			}
			if fi, _ := os.Stat(hostFile); fi.Mode() != 0o600 {
				t.Errorf("the host file's mode changed: %v", fi.Mode())
			}
			if _, err := os.Lstat(filepath.Join(host, "planted")); err == nil {
				t.Error("a file was planted in the host directory")
			}
		})
	}
}

// A symlink the image keeps for itself (merged /usr: lib -> usr/lib) and a
// link pointing out are fine as links: nothing is written through them.
func TestUntarKeepsImageSymlinks(t *testing.T) {
	dst := filepath.Join(t.TempDir(), "root")
	src := writeTar(t, hostileEntry{h: tar.Header{Name: "usr/lib", Typeflag: tar.TypeDir, Mode: 0o755}},
		hostileEntry{h: tar.Header{Name: "lib", Typeflag: tar.TypeSymlink, Linkname: "usr/lib"}},
		hostileEntry{h: tar.Header{Name: "etc/mtab", Typeflag: tar.TypeSymlink, Linkname: "/proc/self/mounts"}})
	if err := Untar(context.Background(), src, dst, &Budget{room: 1 << 30}, true); err != nil {
		t.Fatal(err)
	}
	if l, _ := os.Readlink(filepath.Join(dst, "etc/mtab")); l != "/proc/self/mounts" {
		t.Errorf("etc/mtab -> %q", l)
	}
}

// A sparse file's logical size is charged before a byte is written: a
// 1 TiB sparse entry is refused at once by the space budget.
func TestUntarChargesSparseFilesTheirLogicalSize(t *testing.T) {
	block := func(name string, typ byte, size int) []byte {
		b := make([]byte, 512)
		copy(b, name)
		copy(b[100:], "0000644\x00")
		copy(b[124:], fmt.Sprintf("%011o\x00", size))
		copy(b[148:], "        ")
		b[156] = typ
		copy(b[257:], "ustar\x0000")
		sum := 0
		for _, c := range b {
			sum += int(c)
		}
		copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
		return b
	}
	pad := func(b []byte) []byte { return append(b, make([]byte, (512-len(b)%512)%512)...) }
	rec := func(k, v string) string {
		s := " " + k + "=" + v + "\n"
		n := len(s) + len(fmt.Sprint(len(s)))
		if len(fmt.Sprint(n)) != len(fmt.Sprint(len(s))) {
			n++
		}
		return fmt.Sprint(n) + s
	}
	// PAX sparse format 1.0: the map (one 1-byte region) heads the data.
	recs := rec("GNU.sparse.major", "1") + rec("GNU.sparse.minor", "0") + rec("GNU.sparse.name", "big") + rec("GNU.sparse.realsize", "1099511627776")
	data := append(pad([]byte("1\n0\n1\n")), 'x')
	var out []byte
	out = append(out, block("PaxHeaders/big", 'x', len(recs))...)
	out = append(out, pad([]byte(recs))...)
	out = append(out, block("GNUSparseFile.0/big", '0', len(data))...)
	out = append(out, pad(data)...)
	out = append(out, make([]byte, 1024)...)
	src := filepath.Join(t.TempDir(), "sparse.tar")
	os.WriteFile(src, out, 0o600)
	err := Untar(context.Background(), src, filepath.Join(t.TempDir(), "root"), &Budget{room: 1 << 30, limit: 10 << 30}, true)
	if !errors.Is(err, driver.ErrInvalidInput) || !strings.Contains(err.Error(), "max_image_mib") {
		t.Fatalf("err = %v; want the 10 GiB limit", err)
	}
}

// Empty files cost no bytes: the entry count and the inodes bound them.
func TestUntarBoundsTheNumberOfEntries(t *testing.T) {
	var entries []hostileEntry
	for i := 0; i < 101; i++ {
		entries = append(entries, hostileEntry{h: tar.Header{Name: fmt.Sprintf("f%03d", i), Typeflag: tar.TypeReg}})
	}
	src := writeTar(t, entries...)
	err := Untar(context.Background(), src, filepath.Join(t.TempDir(), "a"), &Budget{room: 1 << 30, maxEntries: 100}, false)
	if !errors.Is(err, driver.ErrInvalidInput) || !strings.Contains(err.Error(), "more than 100 entries (max_image_entries)") {
		t.Errorf("entries: %v", err)
	}
	err = Untar(context.Background(), src, filepath.Join(t.TempDir(), "b"), &Budget{room: 1 << 30, inodes: true, inodeRoom: 50}, false)
	if !errors.Is(err, driver.ErrNoDiskSpace) || !strings.Contains(err.Error(), "inodes") {
		t.Errorf("inodes: %v", err)
	}
	if err := Untar(context.Background(), src, filepath.Join(t.TempDir(), "c"), &Budget{room: 1 << 30, maxEntries: 101}, false); err != nil {
		t.Errorf("101 entries within a limit of 101: %v", err)
	}
}

// A VM's mountinfo: its binds of the disk (7:3), deepest first, and
// nothing of another device, whatever the paths it named say.
func TestMountsOfPicksTheDeviceOnly(t *testing.T) {
	info := []byte(`1 0 0:40 / / rw - overlay overlay rw
2 1 7:3 / /warden-cpi-dev/disk-a rw - ext4 /dev/loop3 rw
3 1 7:3 / /var/vcap/store rw - ext4 /dev/loop3 rw
4 3 7:3 /sub /var/vcap/store/x\040y rw - ext4 /dev/loop3 rw
5 1 7:30 / /var/vcap/data rw - ext4 /dev/loop30 rw
`)
	got := MountsOf(info, unix.Mkdev(7, 3))
	want := []string{"/var/vcap/store/x y", "/var/vcap/store", "/warden-cpi-dev/disk-a"}
	if !slices.Equal(got, want) {
		t.Errorf("MountsOf = %q, want %q", got, want)
	}
}
