package local

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

	"github.com/runway-cpi/runway/src/driver"
)

type stemcellRecord struct {
	CID        string            `json:"cid"`
	CloudProps driver.Props      `json:"cloud_properties"`
	Tags       map[string]string `json:"tags"`
	Source     string            `json:"source"`
	CreatedAt  string            `json:"created_at"`
}

// stemcellProps: what stemcell.MF files carry in cloud_properties,
// recorded; the local driver needs none of it.
type stemcellProps struct {
	driver.StemcellManifest
}

// CreateStemcell implements driver.Driver: the image tarball (tar or
// tar.gz) is unpacked into stemcells/<cid>/image.
func (d *Driver) CreateStemcell(ctx context.Context, spec driver.StemcellSpec) (string, error) {
	var props stemcellProps
	if err := spec.CloudProps.Decode("stemcell cloud_properties", &props); err != nil {
		return "", err
	}
	if spec.ImagePath == "" || !filepath.IsAbs(spec.ImagePath) {
		return "", driver.Invalid("image_path must be an absolute path, got %q", spec.ImagePath)
	}
	// A FIFO or a device would block (or never end) the read.
	if st, err := os.Stat(spec.ImagePath); err != nil {
		return "", driver.Invalid("image_path %s: %v", spec.ImagePath, unwrapPathErr(err))
	} else if !st.Mode().IsRegular() {
		return "", driver.Invalid("image_path %s is not a regular file (%s)", spec.ImagePath, st.Mode().Type())
	}
	cid, err := newCID("sc-")
	if err != nil {
		return "", err
	}
	unlock, err := d.lock(ctx, stemcells, cid)
	if err != nil {
		return "", err
	}
	defer unlock()
	tmp, err := d.stage(stemcells, cid, "image")
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) { _ = os.RemoveAll(tmp); return "", err }
	budget, err := d.spaceBudget(int64(d.cfg.MaxImageMiB) << 20)
	if err != nil {
		return fail(err)
	}
	if err := untar(ctx, spec.ImagePath, filepath.Join(tmp, "image"), budget, d.containers()); err != nil {
		return fail(fmt.Errorf("unpacking stemcell image %s: %w", spec.ImagePath, err))
	}
	rec := stemcellRecord{CID: cid, CloudProps: spec.CloudProps, Tags: spec.Tags, Source: spec.ImagePath, CreatedAt: now()}
	if err := d.publish(stemcells, cid, tmp, rec); err != nil {
		return "", err
	}
	return cid, nil
}

// DeleteStemcell implements driver.Driver; a stemcell already gone is not
// an error (bosh-cli and the Director both expect that).
func (d *Driver) DeleteStemcell(ctx context.Context, cid string) error {
	if err := checkCID("stemcell", cid); err != nil {
		return err
	}
	unlock, err := d.lock(ctx, stemcells, cid)
	if err != nil {
		return err
	}
	defer unlock()
	defer d.sweep(stemcells)
	if ok, err := d.has(stemcells, cid); err != nil {
		return err
	} else if !ok {
		d.log.Info("local", "stemcell %s already gone", cid)
		return nil
	}
	return d.remove(stemcells, cid)
}

// untar unpacks src into dst, refusing entries that would land outside dst
// and anything but regular files, directories, symlinks and hard links,
// and stopping with the call's context or when the content outgrows
// budget (bytes, entries, inodes). rootfs: the image is a VM's root file
// system (container mode): owners, modes (setuid, sticky) and times are
// kept, and device nodes and FIFOs skipped (the runtime makes /dev).
//
// Every step goes through an os.Root on dst, so no path, link or earlier
// entry of the archive can make it touch anything outside the image; an
// entry that would land on a symlink the archive planted is refused.
func untar(ctx context.Context, src, dst string, budget *spaceBudget, rootfs bool) error {
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
	tr := tar.NewReader(r)
	entries := 0
	links := map[string]bool{}
	type dirTime struct {
		name string
		t    time.Time
	}
	var dirTimes []dirTime
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
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
		name := filepath.Clean(h.Name)
		if filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("entry %q escapes the image directory", h.Name)
		}
		if name == "." {
			// The image's root: its mode matters (a 0700 root keeps every
			// user but root out of the VM's whole file system).
			if h.Typeflag == tar.TypeDir && rootfs {
				if err := root.Chown(".", h.Uid, h.Gid); err != nil {
					return err
				}
				if err := root.Chmod(".", os.FileMode(h.Mode&0o777)|modeBits(h.Mode)); err != nil {
					return err
				}
			}
			continue
		}
		// A file below a symlink from the same archive could land anywhere;
		// so could one written onto it.
		for p := name; p != "."; p = filepath.Dir(p) {
			if links[p] {
				return fmt.Errorf("entry %q lies on or below symlink %q of the same archive", h.Name, p)
			}
		}
		keep := func() error {
			if !rootfs {
				return nil
			}
			if err := root.Lchown(name, h.Uid, h.Gid); err != nil {
				return err
			}
			if h.Typeflag == tar.TypeSymlink {
				return nil
			}
			// After chown, which clears setuid bits.
			if err := root.Chmod(name, os.FileMode(h.Mode&0o777)|modeBits(h.Mode)); err != nil {
				return err
			}
			if h.Typeflag == tar.TypeDir {
				dirTimes = append(dirTimes, dirTime{name, h.ModTime}) // set once nothing is added below
				return nil
			}
			return root.Chtimes(name, h.AccessTime, h.ModTime)
		}
		parent := func() error { return root.MkdirAll(filepath.Dir(name), 0o755) }
		switch h.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, 0o755); err != nil {
				return err
			}
			if err := keep(); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := budget.take(h.Size); err != nil {
				return fmt.Errorf("entry %q: %w", h.Name, err)
			}
			if err := parent(); err != nil {
				return err
			}
			out, err := root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, os.FileMode(h.Mode&0o755|0o600))
			if err != nil {
				return err
			}
			_, err = copyContext(ctx, out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if err := keep(); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := parent(); err != nil {
				return err
			}
			if err := root.Symlink(h.Linkname, name); err != nil {
				return err
			}
			links[name] = true
			if err := keep(); err != nil {
				return err
			}
		case tar.TypeLink:
			old := filepath.Clean(h.Linkname)
			if filepath.IsAbs(old) || old == ".." || strings.HasPrefix(old, "../") || old == "." {
				return fmt.Errorf("hard link %q escapes the image directory", h.Name)
			}
			for p := old; p != "."; p = filepath.Dir(p) {
				if links[p] {
					return fmt.Errorf("hard link %q points through symlink %q", h.Name, p)
				}
			}
			if err := parent(); err != nil {
				return err
			}
			if err := root.Link(old, name); err != nil {
				return err
			}
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			if !rootfs {
				return fmt.Errorf("entry %q has unsupported type %q", h.Name, h.Typeflag)
			}
		default:
			return fmt.Errorf("entry %q has unsupported type %q", h.Name, h.Typeflag)
		}
	}
	if entries == 0 {
		return errors.New("not a valid tar archive: no entries")
	}
	for i := len(dirTimes) - 1; i >= 0; i-- {
		if err := root.Chtimes(dirTimes[i].name, dirTimes[i].t, dirTimes[i].t); err != nil {
			return err
		}
	}
	return nil
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
