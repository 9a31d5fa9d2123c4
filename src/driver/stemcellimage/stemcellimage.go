// Package stemcellimage reads a stemcell's image file as the cloud
// drivers upload it: gzipped or not, a tar holding the image or the raw
// image itself.
package stemcellimage

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"fmt"
	"io"
	"os"
)

const bufSize = 64 << 10

// Open answers the bytes of the file at path, gunzipped when it starts
// with gzip's magic, and their size (-1 when gzipped: unknown before
// reading). closeFn closes the file.
func Open(path string) (r *bufio.Reader, size int64, closeFn func(), err error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, nil, err
	}
	closeFn = func() { f.Close() }
	st, err := f.Stat()
	if err != nil {
		closeFn()
		return nil, 0, nil, err
	}
	br := bufio.NewReaderSize(f, bufSize)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			closeFn()
			return nil, 0, nil, fmt.Errorf("%s: %w", path, err)
		}
		return bufio.NewReaderSize(gz, bufSize), -1, closeFn, nil
	}
	return br, st.Size(), closeFn, nil
}

// Member answers, when r starts with a tar header, a reader of the first
// regular file whose name match accepts, and that file's header; when r
// holds no tar it answers nil, nil, nil (r is then the image itself). Its
// error is the tar reader's: no such file before the tar's end.
func Member(r *bufio.Reader, match func(name string) bool) (io.Reader, *tar.Header, error) {
	if hdr, _ := r.Peek(512); len(hdr) < 512 || string(hdr[257:262]) != "ustar" {
		return nil, nil, nil
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err != nil {
			return nil, nil, err
		}
		if h.Typeflag == tar.TypeReg && match(h.Name) {
			return tr, h, nil
		}
	}
}
