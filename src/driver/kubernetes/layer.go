package kubernetes

// A heavy stemcell's rootfs tarball written anew as one image layer, from
// the entries src/driver/tarcheck let through.

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"strings"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/agentprofile"
	"github.com/runway-cpi/runway/src/driver/tarcheck"
)

// reserveBytes stay free on the file system the layer is written to, as
// the local driver keeps them free on its state dir.
const reserveBytes = 64 << 20

// layerFile is a layer written to a temporary file, its digests taken as
// it was written (nothing reads it again before the push).
type layerFile struct {
	path           string
	digest, diffID v1.Hash
	size           int64
	hasAgent       bool // the stemcell has the agent's init (agentprofile.Init)
}

var _ v1.Layer = (*layerFile)(nil)

func (l *layerFile) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *layerFile) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *layerFile) Size() (int64, error)                { return l.size, nil }
func (l *layerFile) MediaType() (types.MediaType, error) { return types.DockerLayer, nil }
func (l *layerFile) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }

func (l *layerFile) Uncompressed() (io.ReadCloser, error) {
	f, err := os.Open(l.path)
	if err != nil {
		return nil, err
	}
	zr, err := gzip.NewReader(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return struct {
		io.Reader
		io.Closer
	}{zr, f}, nil
}

// cleanLayer writes the entries of a rootfs tarball (gzip or plain) that
// tarcheck accepts to a new gzip tarball in the temporary directory,
// within lim and the room the directory's file system has, stopping with
// ctx. Nothing of it is left on an error.
func cleanLayer(ctx context.Context, src string, lim tarcheck.Limits) (l *layerFile, err error) {
	in, err := os.Open(src)
	if err != nil {
		return nil, err
	}
	defer in.Close()
	br := bufio.NewReader(in)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, driver.Invalid("not gzip: %v", err)
		}
		defer gz.Close()
		r = gz
	}
	w, err := newLayerWriter()
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			w.discard()
		}
	}()
	c := tarcheck.New(lim)
	tr := tar.NewReader(r)
	hasAgent := false
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, driver.Invalid("not a valid tar archive: %v", err)
		}
		if err := c.Check(h); errors.Is(err, tarcheck.ErrSkip) {
			continue // the runtime makes /dev
		} else if err != nil {
			return nil, err
		}
		if "/"+tarcheck.Rel(h.Name) == agentprofile.Init {
			hasAgent = true
		}
		if err := w.entry(ctx, h, tr); err != nil {
			return nil, err
		}
	}
	if c.Entries() == 0 {
		return nil, driver.Invalid("not a valid tar archive: no entries")
	}
	l, err = w.finish()
	if err != nil {
		return nil, err
	}
	l.hasAgent = hasAgent
	return l, nil
}

// layerWriter is the layer's tar stream: hashed (the diff ID), gzipped,
// hashed again (the digest) and written to a file within its room.
type layerWriter struct {
	f            *os.File
	room         *roomWriter
	zw           *gzip.Writer
	tw           *tar.Writer
	diff, digest hash.Hash
}

func newLayerWriter() (*layerWriter, error) {
	dir := os.TempDir()
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return nil, err
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if free <= reserveBytes {
		return nil, fmt.Errorf("%w: %d MiB free in %s, %d MiB are kept free", driver.ErrNoDiskSpace, free>>20, dir, reserveBytes>>20)
	}
	f, err := os.CreateTemp(dir, "runway-layer-*.tar.gz")
	if err != nil {
		return nil, err
	}
	w := &layerWriter{f: f, diff: sha256.New(), digest: sha256.New()}
	w.room = &roomWriter{w: io.MultiWriter(f, w.digest), room: free - reserveBytes, where: dir}
	w.zw, _ = gzip.NewWriterLevel(w.room, gzip.BestSpeed)
	w.tw = tar.NewWriter(io.MultiWriter(w.zw, w.diff))
	return w, nil
}

// entry writes a checked entry: a new header of the fields a layer
// needs (a sparse file becomes a plain one), then its content.
func (w *layerWriter) entry(ctx context.Context, h *tar.Header, tr io.Reader) error {
	n := &tar.Header{Name: tarcheck.Rel(h.Name), Typeflag: h.Typeflag, Mode: h.Mode, Uid: h.Uid, Gid: h.Gid,
		Uname: h.Uname, Gname: h.Gname, ModTime: h.ModTime, Format: tar.FormatPAX}
	switch h.Typeflag {
	case tar.TypeDir:
		n.Name += "/"
	case tar.TypeReg, tar.TypeGNUSparse:
		n.Typeflag, n.Size = tar.TypeReg, h.Size
	case tar.TypeSymlink:
		n.Linkname = h.Linkname
	case tar.TypeLink:
		n.Linkname = tarcheck.Rel(h.Linkname)
	}
	// Extended attributes stay (file capabilities: ping's cap_net_raw).
	for k, v := range h.PAXRecords {
		if strings.HasPrefix(k, "SCHILY.xattr.") {
			if n.PAXRecords == nil {
				n.PAXRecords = map[string]string{}
			}
			n.PAXRecords[k] = v
		}
	}
	if err := w.tw.WriteHeader(n); err != nil {
		return w.failed(err)
	}
	if n.Typeflag != tar.TypeReg {
		return nil
	}
	_, err := tarcheck.Copy(ctx, w.tw, tr)
	return w.failed(err)
}

// failed keeps a typed error of the room as it is.
func (w *layerWriter) failed(err error) error {
	if err != nil && w.room.err != nil {
		return w.room.err
	}
	return err
}

func (w *layerWriter) finish() (*layerFile, error) {
	if err := w.tw.Close(); err != nil {
		return nil, w.failed(err)
	}
	if err := w.zw.Close(); err != nil {
		return nil, w.failed(err)
	}
	if err := w.f.Close(); err != nil {
		return nil, err
	}
	return &layerFile{path: w.f.Name(), size: w.room.n,
		digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(w.digest.Sum(nil))},
		diffID: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(w.diff.Sum(nil))}}, nil
}

func (w *layerWriter) discard() {
	w.f.Close()
	os.Remove(w.f.Name())
}

// roomWriter refuses to write past room bytes: the file system keeps its
// reserve.
type roomWriter struct {
	w       io.Writer
	n, room int64
	where   string
	err     error
}

func (r *roomWriter) Write(p []byte) (int, error) {
	if r.n+int64(len(p)) > r.room {
		r.err = fmt.Errorf("%w: the layer grows past the %d MiB free in %s (%d MiB are kept free)",
			driver.ErrNoDiskSpace, r.room>>20, r.where, reserveBytes>>20)
		return 0, r.err
	}
	n, err := r.w.Write(p)
	r.n += int64(n)
	return n, err
}
