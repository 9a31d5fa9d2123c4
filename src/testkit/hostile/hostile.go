// Package hostile is what the hostile tests run inside VMs: a stemcell
// image with busybox and vmprobe (cmd/vmprobe), a static program for the
// attacks a shell cannot make.
package hostile

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/runway-cpi/runway/src/testkit/rootfs"
)

// Image builds vmprobe and writes a rootfs tarball into dir holding
// busybox (at /bin, with its applets) and /bin/vmprobe; it answers the
// tarball's path.
func Image(dir string) (string, error) {
	probe, err := Probe(dir)
	if err != nil {
		return "", err
	}
	img := filepath.Join(dir, "hostile.tgz")
	if err := rootfs.Write(img, map[string]string{"/bin/vmprobe": probe}); err != nil {
		return "", err
	}
	return img, nil
}

// Probe builds vmprobe (static) into dir and answers its path, for a VM
// of another image to be given.
func Probe(dir string) (string, error) {
	probe := filepath.Join(dir, "vmprobe")
	cmd := exec.Command("go", "build", "-o", probe, "github.com/runway-cpi/runway/src/testkit/hostile/cmd/vmprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building vmprobe: %v\n%s", err, out)
	}
	return probe, nil
}
