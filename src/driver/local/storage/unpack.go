// Package storage is the local driver's files on the host: stemcell
// images unpacked within a space budget, copies, records written
// atomically, and the mount table.
package storage

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/driver/tarcheck"
)

// Untar unpacks src into dst, refusing entries that would land outside dst
// and anything but regular files, directories, symlinks and hard links,
// and stopping with the call's context or when the content outgrows
// budget (bytes, entries, inodes). rootfs: the image is a VM's root file
// system (container mode): owners, modes (setuid, sticky) and times are
// kept, and device nodes and FIFOs skipped (the runtime makes /dev).
//
// Every step goes through an os.Root on dst, so no path, link or earlier
// entry of the archive can make it touch anything outside the image; an
// entry that would land on a symlink the archive planted is refused.
func Untar(ctx context.Context, src, dst string, budget *Budget, rootfs bool) error {
	f, err := os.Open(src)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return err
		}
		defer gz.Close()
		r = gz
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer root.Close()
	u := &unpacker{ctx: ctx, root: root, tr: tar.NewReader(r), budget: budget, rootfs: rootfs, links: map[string]bool{}}
	entries := 0
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := u.tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("not a valid tar archive: %w", err)
		}
		entries++
		if err := budget.takeEntry(); err != nil {
			return err
		}
		if err := u.entry(h); err != nil {
			return err
		}
	}
	if entries == 0 {
		return errors.New("not a valid tar archive: no entries")
	}
	// Directories' times last: adding below a directory changes its own.
	for i := len(u.dirTimes) - 1; i >= 0; i-- {
		if err := root.Chtimes(u.dirTimes[i].name, u.dirTimes[i].t, u.dirTimes[i].t); err != nil {
			return err
		}
	}
	return nil
}

// unpacker writes one archive's entries under its root (os.Root: no
// entry can reach outside it, whatever its name or links).
type unpacker struct {
	ctx      context.Context
	root     *os.Root
	tr       *tar.Reader
	budget   *Budget
	rootfs   bool // a root file system: owners, modes, times and devices kept
	links    map[string]bool
	dirTimes []dirTime
}

type dirTime struct {
	name string
	t    time.Time
}

// entry writes one entry.
func (u *unpacker) entry(h *tar.Header) error {
	name := filepath.Clean(h.Name)
	if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
		return fmt.Errorf("entry %q escapes the image directory", h.Name)
	}
	if name == "." {
		// The image's root: its mode matters (a 0700 root keeps every
		// user but root out of the VM's whole file system).
		if h.Typeflag == tar.TypeDir && u.rootfs {
			if err := u.root.Chown(".", h.Uid, h.Gid); err != nil {
				return err
			}
			return u.root.Chmod(".", os.FileMode(h.Mode&0o777)|modeBits(h.Mode))
		}
		return nil
	}
	// A file below a symlink from the same archive could land anywhere;
	// so could one written onto it.
	for p := name; p != "."; p = filepath.Dir(p) {
		if u.links[p] {
			return fmt.Errorf("entry %q lies on or below symlink %q of the same archive", h.Name, p)
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if err := u.root.MkdirAll(name, 0o755); err != nil {
			return err
		}
		return u.keep(name, h)
	case tar.TypeReg:
		return u.file(name, h)
	case tar.TypeSymlink:
		if err := u.root.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			return err
		}
		if err := u.root.Symlink(h.Linkname, name); err != nil {
			return err
		}
		u.links[name] = true
		return u.keep(name, h)
	case tar.TypeLink:
		return u.hardLink(name, h)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if !u.rootfs {
			return fmt.Errorf("entry %q has unsupported type %q", h.Name, h.Typeflag)
		}
		return nil
	}
	return fmt.Errorf("entry %q has unsupported type %q", h.Name, h.Typeflag)
}

// file writes a regular file, within the space budget.
func (u *unpacker) file(name string, h *tar.Header) error {
	if err := u.budget.Take(h.Size); err != nil {
		return fmt.Errorf("entry %q: %w", h.Name, err)
	}
	if err := u.root.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	out, err := u.root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(h.Mode&0o755|0o600))
	if err != nil {
		return err
	}
	_, err = tarcheck.Copy(u.ctx, out, u.tr)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return u.keep(name, h)
}

// hardLink links to an earlier entry, never through one of the
// archive's symlinks.
func (u *unpacker) hardLink(name string, h *tar.Header) error {
	old := filepath.Clean(h.Linkname)
	if filepath.IsAbs(old) || old == ".." || strings.HasPrefix(old, "../") || old == "." {
		return fmt.Errorf("hard link %q escapes the image directory", h.Name)
	}
	for p := old; p != "."; p = filepath.Dir(p) {
		if u.links[p] {
			return fmt.Errorf("hard link %q points through symlink %q", h.Name, p)
		}
	}
	if err := u.root.MkdirAll(filepath.Dir(name), 0o755); err != nil {
		return err
	}
	return u.root.Link(old, name)
}

// keep applies a root file system entry's owner, mode and times.
func (u *unpacker) keep(name string, h *tar.Header) error {
	if !u.rootfs {
		return nil
	}
	if err := u.root.Lchown(name, h.Uid, h.Gid); err != nil {
		return err
	}
	if h.Typeflag == tar.TypeSymlink {
		return nil
	}
	// After chown, which clears setuid bits.
	if err := u.root.Chmod(name, os.FileMode(h.Mode&0o777)|modeBits(h.Mode)); err != nil {
		return err
	}
	if h.Typeflag == tar.TypeDir {
		u.dirTimes = append(u.dirTimes, dirTime{name, h.ModTime}) // set once nothing is added below
		return nil
	}
	return u.root.Chtimes(name, h.AccessTime, h.ModTime)
}

// modeBits maps tar's setuid, setgid and sticky bits to Go's.
func modeBits(m int64) os.FileMode {
	var out os.FileMode
	if m&0o4000 != 0 {
		out |= os.ModeSetuid
	}
	if m&0o2000 != 0 {
		out |= os.ModeSetgid
	}
	if m&0o1000 != 0 {
		out |= os.ModeSticky
	}
	return out
}
