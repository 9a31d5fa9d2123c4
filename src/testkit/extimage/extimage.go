// Package extimage reads and writes files in an ext4 image that is not
// mounted (a detached disk of the local driver), with e2fsprogs' debugfs:
// what tests check a disk's data with, mounting nothing.
package extimage

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// ReadFile answers the content of name (absolute in the image).
func ReadFile(image, name string) ([]byte, error) {
	cmd := exec.Command("debugfs", "-R", "cat "+name, image)
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("debugfs cat %s in %s: %v: %s", name, image, err, stderr.String())
	}
	// debugfs says what it could not find on stderr and exits 0.
	if bytes.Contains(stderr.Bytes(), []byte("File not found")) {
		return nil, fmt.Errorf("%s: not in %s", name, image)
	}
	return out.Bytes(), nil
}

// WriteFile writes data as name (absolute, in the image's root directory).
func WriteFile(image, name string, data []byte) error {
	src := filepath.Join(os.TempDir(), fmt.Sprintf("extimage-%d", os.Getpid()))
	if err := os.WriteFile(src, data, 0o600); err != nil {
		return err
	}
	defer os.Remove(src)
	cmd := exec.Command("debugfs", "-w", "-R", "write "+src+" "+name, image)
	if out, err := cmd.CombinedOutput(); err != nil || bytes.Contains(out, []byte("rror")) {
		return fmt.Errorf("debugfs write %s in %s: %v: %s", name, image, err, out)
	}
	return nil
}
