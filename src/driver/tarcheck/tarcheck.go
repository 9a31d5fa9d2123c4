// Package tarcheck holds the entries of a root file system tarball (a
// heavy stemcell) to the rules every driver applies before it writes any
// of them, one header at a time, as the archive streams by:
//
//   - no name leaves the archive's root (absolute, "..");
//   - no entry lies on or below a symlink the same archive made (it could
//     land anywhere the link points);
//   - a hard link points at an earlier regular file of the archive, by a
//     name that stays in the root and is not and goes through none of its
//     symlinks;
//   - only files, directories, symlinks and hard links are written; device
//     nodes and FIFOs are ErrSkip (a runtime makes /dev), anything else is
//     refused;
//   - a budget: entries, and content bytes by the size each entry declares
//     — what a copy writes, holes of a sparse file included — so an archive
//     of a few hundred bytes cannot declare gigabytes.
//
// Errors wrap driver.ErrInvalidInput (the archive is the caller's input)
// or, past the room the destination has, driver.ErrNoDiskSpace.
package tarcheck

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"

	"github.com/runway-cpi/runway/src/driver"
)

// Limits bound one archive; 0 is no bound. Bytes and Entries are named
// in errors by the config keys the drivers give them: max_image_mib and
// max_image_entries.
type Limits struct {
	// Bytes is the most content the archive's entries may declare, summed.
	Bytes int64
	// Entries is the most headers the archive may have, of any type.
	Entries int64
	// Room is what the destination can take; past it the error is
	// driver.ErrNoDiskSpace rather than the archive's fault.
	Room int64
}

// ErrSkip is Check's answer for a device node or FIFO: nothing of it is
// written into a root file system. A caller unpacking anything else
// refuses it.
var ErrSkip = errors.New("tarcheck: a device node or FIFO")

// Checker follows one archive from its first header.
type Checker struct {
	lim            Limits
	entries, bytes int64
	symlinks       map[string]bool // every name a symlink entry had
	files          map[string]bool // regular files (and links to them): what a hard link may point at
}

// New starts checking an archive.
func New(l Limits) *Checker {
	return &Checker{lim: l, symlinks: map[string]bool{}, files: map[string]bool{}}
}

// Bytes is the content the archive's entries have declared so far.
func (c *Checker) Bytes() int64 { return c.bytes }

// Entries is how many headers Check has been given.
func (c *Checker) Entries() int64 { return c.entries }

// Check takes the archive's next header. nil: write the entry as
// Rel(h.Name) (and a hard link to Rel(h.Linkname)); ErrSkip: leave it out;
// any other error: stop, write nothing more.
func (c *Checker) Check(h *tar.Header) error {
	c.entries++
	if c.lim.Entries > 0 && c.entries > c.lim.Entries {
		return driver.Invalid("the image has more than %d entries (max_image_entries)", c.lim.Entries)
	}
	name, ok := inRoot(h.Name)
	if !ok {
		return driver.Invalid("entry %q leaves the image's root", h.Name)
	}
	if name == "." {
		if h.Typeflag != tar.TypeDir {
			return driver.Invalid("entry %q is the image's root, and not a directory", h.Name)
		}
		return nil
	}
	if p := c.throughSymlink(name); p != "" {
		return driver.Invalid("entry %q lies on or below symlink %q of the same archive", h.Name, p)
	}
	switch h.Typeflag {
	case tar.TypeDir:
		delete(c.files, name)
	case tar.TypeReg, tar.TypeGNUSparse:
		if err := c.take(h); err != nil {
			return err
		}
		c.files[name] = true
	case tar.TypeSymlink:
		c.symlinks[name] = true
		delete(c.files, name)
	case tar.TypeLink:
		if err := c.hardLink(h); err != nil {
			return err
		}
		c.files[name] = true
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		delete(c.files, name)
		return ErrSkip
	default:
		return driver.Invalid("entry %q: type %q is not a file, directory or link", h.Name, h.Typeflag)
	}
	return nil
}

// take charges a file's declared size: what writing it costs, whatever
// the archive holds (a sparse file's holes are written as zeros).
func (c *Checker) take(h *tar.Header) error {
	n := h.Size
	if n < 0 {
		return driver.Invalid("entry %q declares a negative size", h.Name)
	}
	if c.lim.Bytes > 0 && n > c.lim.Bytes-c.bytes {
		return driver.Invalid("entry %q: content grows past the %d MiB limit (max_image_mib)", h.Name, c.lim.Bytes>>20)
	}
	if c.lim.Room > 0 && n > c.lim.Room-c.bytes {
		return fmt.Errorf("%w: entry %q: content grows past the %d MiB there is room for", driver.ErrNoDiskSpace, h.Name, c.lim.Room>>20)
	}
	c.bytes += n
	return nil
}

// hardLink: to an earlier file of the archive, inside the root, neither
// to nor through one of its symlinks (a runtime resolves the link's
// target: it would be whatever the symlink points at).
func (c *Checker) hardLink(h *tar.Header) error {
	old, ok := inRoot(h.Linkname)
	if !ok || old == "." {
		return driver.Invalid("hard link %q to %q leaves the image's root", h.Name, h.Linkname)
	}
	if p := c.throughSymlink(old); p != "" {
		return driver.Invalid("hard link %q to %q points through symlink %q of the same archive", h.Name, h.Linkname, p)
	}
	if !c.files[old] {
		return driver.Invalid("hard link %q to %q: the archive has no earlier file of that name", h.Name, h.Linkname)
	}
	return nil
}

// throughSymlink is the first of name and its parents that the archive
// made a symlink, or "".
func (c *Checker) throughSymlink(name string) string {
	for p := name; p != "." && p != "/"; p = path.Dir(p) {
		if c.symlinks[p] {
			return p
		}
	}
	return ""
}

// Rel is an entry's name relative to the root, clean ("." for the root
// itself); meaningful for names Check accepted.
func Rel(name string) string {
	n, _ := inRoot(name)
	return n
}

func inRoot(p string) (string, bool) {
	if path.IsAbs(p) {
		return "", false
	}
	c := path.Clean(p)
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", false
	}
	return c, true
}

// buffers are Copy's: an archive of many small files copies each with
// the same few buffers.
var buffers = sync.Pool{New: func() any { b := make([]byte, 1<<20); return &b }}

// Copy copies an entry's content like io.Copy, stopping with ctx between
// chunks of 1 MiB.
func Copy(ctx context.Context, dst io.Writer, src io.Reader) (int64, error) {
	bp := buffers.Get().(*[]byte)
	defer buffers.Put(bp)
	buf := *bp
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		r, rerr := src.Read(buf)
		if r > 0 {
			w, werr := dst.Write(buf[:r])
			n += int64(w)
			if werr != nil {
				return n, werr
			}
		}
		if errors.Is(rerr, io.EOF) {
			return n, nil
		}
		if rerr != nil {
			return n, rerr
		}
	}
}
