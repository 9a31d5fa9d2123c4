package vsphere

import (
	"archive/tar"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/runway-cpi/runway/src/driver"
)

// A stemcell tarball is the caller's input: anything but files at its top
// level (a path out of the directory, a link, a device) is refused by name
// before anything is written, and nothing lands outside the unpack dir.
func TestHostileStemcellTarballs(t *testing.T) {
	sim := newSim(t)
	d := sim.newDriver(t, nil)
	outside := filepath.Join(t.TempDir(), "victim")
	for name, hdr := range map[string]*tar.Header{
		"dot-dot":  {Name: "../victim", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644},
		"absolute": {Name: outside, Typeflag: tar.TypeReg, Size: 1, Mode: 0o644},
		"symlink":  {Name: "image.ovf", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"},
		"hardlink": {Name: "image.ovf", Typeflag: tar.TypeLink, Linkname: "/etc/shadow"},
		"device":   {Name: "disk", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3},
		"subdir":   {Name: "a/image.ovf", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644},
	} {
		img := filepath.Join(t.TempDir(), "image")
		f, _ := os.Create(img)
		tw := tar.NewWriter(f)
		_ = tw.WriteHeader(hdr)
		if hdr.Size > 0 {
			_, _ = tw.Write([]byte("x"))
		}
		_ = tw.Close()
		_ = f.Close()
		_, err := d.CreateStemcell(bg, driver.StemcellSpec{ImagePath: img})
		if !errors.Is(err, driver.ErrInvalidInput) {
			t.Errorf("%s: %v; want an input error", name, err)
		}
		if _, err := os.Stat(outside); err == nil {
			t.Fatalf("%s: a file was written outside the unpack directory", name)
		}
	}
}
