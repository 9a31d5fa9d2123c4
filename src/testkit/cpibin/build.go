package cpibin

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// BuildDirVar names the directory scripts/test makes for one run: every
// test binary of that run builds a set of executables once into it and
// the others reuse the build, instead of each compiling its own (under
// `go test ./...` the packages' binaries run side by side).
const BuildDirVar = "RUNWAY_BUILD_DIR"

var (
	buildMu sync.Mutex
	builds  = map[string]string{}
)

// Build builds pkgs (import paths of main packages, static: CGO off) into
// one directory and answers it: once per run under BuildDirVar, else once
// per test binary. Executables are named after their package's last
// element.
func Build(pkgs ...string) (string, error) {
	sum := sha256.Sum256([]byte(strings.Join(pkgs, "\n")))
	key := hex.EncodeToString(sum[:6])
	buildMu.Lock()
	defer buildMu.Unlock()
	if d, ok := builds[key]; ok {
		return d, nil
	}
	var dir string
	if shared := os.Getenv(BuildDirVar); shared != "" {
		dir = filepath.Join(shared, key)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return "", err
		}
		// Another test binary may be building the same set: the first
		// builds, the others wait for it and reuse its build.
		lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return "", err
		}
		defer lock.Close()
		if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
			return "", err
		}
		if _, err := os.Stat(filepath.Join(dir, ".built")); err == nil {
			builds[key] = dir
			return dir, nil
		}
	} else {
		var err error
		if dir, err = os.MkdirTemp("", "runway-cpibin-"); err != nil {
			return "", err
		}
	}
	cmd := exec.Command("go", append([]string{"build", "-o", dir + "/"}, pkgs...)...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building %s: %v\n%s", strings.Join(pkgs, " "), err, out)
	}
	if err := os.WriteFile(filepath.Join(dir, ".built"), nil, 0o644); err != nil {
		return "", err
	}
	builds[key] = dir
	return dir, nil
}
