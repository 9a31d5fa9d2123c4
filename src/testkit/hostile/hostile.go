// Package hostile is what the hostile tests run inside VMs: a stemcell
// image with busybox and vmprobe (cmd/vmprobe), a static program for the
// attacks a shell cannot make.
package hostile

import (
	"path/filepath"

	"github.com/runway-cpi/runway/src/testkit/cpibin"
	"github.com/runway-cpi/runway/src/testkit/rootfs"
)

// Image builds vmprobe and writes a rootfs tarball into dir holding
// busybox (at /bin, with its applets) and /bin/vmprobe; it answers the
// tarball's path.
func Image(dir string) (string, error) {
	probe, err := Probe()
	if err != nil {
		return "", err
	}
	img := filepath.Join(dir, "hostile.tgz")
	if err := rootfs.Write(img, map[string]string{"/bin/vmprobe": probe}); err != nil {
		return "", err
	}
	return img, nil
}

// Probe builds vmprobe (static; once per run, cpibin.Build) and answers
// its path, for a VM of another image to be given.
func Probe() (string, error) {
	dir, err := cpibin.Build("github.com/runway-cpi/runway/src/testkit/hostile/cmd/vmprobe")
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "vmprobe"), nil
}
