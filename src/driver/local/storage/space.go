package storage

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/tarcheck"
)

// ReserveBytes is left free on the state dir's file system by every copy
// and image: a full disk breaks every later call (locks, records), not
// just this one.
const ReserveBytes = 64 << 20

// reserveInodes is left free likewise: empty files cost no bytes, but
// each takes an inode.
const reserveInodes = 10000

// Budget bounds what one call writes: at most limit bytes (when > 0)
// and maxEntries files (when > 0), and never so much that less than
// ReserveBytes or reserveInodes stays free.
type Budget struct {
	room, limit, used int64
	// entries: files made so far; inodeRoom counts only when inodes (the
	// file system has a fixed inode table).
	entries, maxEntries, inodeRoom int64
	inodes                         bool
	where                          string
}

// NewBudget measures the free space of the file system holding dir now;
// limit and maxEntries bound the content (0: no bound but the space).
func NewBudget(dir string, limit int64, maxEntries int) (*Budget, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return nil, err
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	b := &Budget{room: free - ReserveBytes, limit: limit, where: dir, maxEntries: int64(maxEntries)}
	if st.Files > 0 { // file systems without a fixed inode table report 0
		b.inodes, b.inodeRoom = true, int64(st.Ffree)-reserveInodes
	}
	if b.room <= 0 {
		return nil, fmt.Errorf("%w: %d MiB free in %s, %d MiB are kept free", driver.ErrNoDiskSpace, free>>20, dir, ReserveBytes>>20)
	}
	return b, nil
}

// takeEntry accounts for one more file, or says why it does not fit.
func (b *Budget) takeEntry() error {
	b.entries++
	if b.maxEntries > 0 && b.entries > b.maxEntries {
		return driver.Invalid("the image has more than %d entries (max_image_entries)", b.maxEntries)
	}
	if b.inodes && b.entries > b.inodeRoom {
		return fmt.Errorf("%w: the image needs more than the %d inodes free in %s (%d are kept free)",
			driver.ErrNoDiskSpace, b.inodeRoom, b.where, reserveInodes)
	}
	return nil
}

// Fits says whether n more bytes would fit, charging nothing: a copy
// checks the whole first, then is charged file by file (what it copies
// may change meanwhile).
func (b *Budget) Fits(n int64) error {
	used := b.used
	err := b.Take(n)
	b.used = used
	return err
}

// Take accounts for n more bytes, or says why they do not fit.
func (b *Budget) Take(n int64) error {
	if b.limit > 0 && b.used+n > b.limit {
		return driver.Invalid("content grows past the %d MiB limit (max_image_mib)", b.limit>>20)
	}
	if b.used+n > b.room {
		return fmt.Errorf("%w: content grows past the %d MiB free in %s (%d MiB are kept free)",
			driver.ErrNoDiskSpace, b.room>>20, b.where, ReserveBytes>>20)
	}
	b.used += n
	return nil
}

// TreeSize is the bytes of the regular files under dir.
func TreeSize(dir string) (int64, error) {
	var total int64
	err := filepath.WalkDir(dir, func(_ string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type().IsRegular() {
			info, err := e.Info()
			if err != nil {
				return err
			}
			total += info.Size()
		}
		return nil
	})
	return total, err
}

// CopyTree copies dir src to dst (which must not exist): directories,
// regular files and symlinks; sockets, FIFOs and devices a VM made are not
// data and are skipped. Both sides are opened as roots: a VM that swaps a
// directory for a link mid-copy cannot make it read or write beyond them.
// It follows ctx and charges budget per file.
func CopyTree(ctx context.Context, src, dst string, budget *Budget) error {
	in, err := os.OpenRoot(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	out, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer out.Close()
	return fs.WalkDir(in.FS(), ".", func(name string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		info, err := e.Info()
		if err != nil {
			return err
		}
		switch {
		case e.IsDir():
			if name == "." {
				return out.Chmod(".", info.Mode().Perm()|0o700)
			}
			return out.Mkdir(name, info.Mode().Perm()|0o700)
		case e.Type()&fs.ModeSymlink != 0:
			link, err := in.Readlink(name)
			if err != nil {
				return err
			}
			return out.Symlink(link, name)
		case e.Type().IsRegular():
			if err := budget.Take(info.Size()); err != nil {
				return err
			}
			r, err := in.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
			if err != nil {
				return err
			}
			defer r.Close()
			w, err := out.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, info.Mode().Perm()|0o600)
			if err != nil {
				return err
			}
			_, err = tarcheck.Copy(ctx, w, r)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			return err
		}
		return nil
	})
}
