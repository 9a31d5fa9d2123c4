package release

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/runway-cpi/runway/src/driver/catalog"
)

// Binaries are the executables the runway_cpi package carries, by their
// main package: bin/cpi, the driver executables it runs (one per row of
// the driver table), the orchestrator.
var Binaries = func() map[string]string {
	m := map[string]string{"cpi": "./src/cmd/cpi", "runway": "./src/cmd/runway"}
	for _, d := range catalog.Drivers {
		m[d.Executable()] = "./" + d.Main()
	}
	return m
}()

// StageDir is where Stage puts them: the runway_cpi package's files
// (src/runway_cpi/bin/*, git-ignored).
func StageDir(root string) string { return filepath.Join(root, "src", "runway_cpi", "bin") }

// Stage builds the package's static linux/amd64 executables with the Go
// toolchain go.mod pins. Same commit and toolchain, same bytes: -trimpath
// drops paths, -buildvcs=false drops the dirty flag, no cgo, no build id.
func Stage(root string) error {
	want, err := pinnedGo(root)
	if err != nil {
		return err
	}
	out, err := exec.Command("go", "env", "GOVERSION").Output()
	if err != nil {
		return fmt.Errorf("running go env GOVERSION: %w", err)
	}
	if have := strings.TrimSpace(string(out)); have != want {
		return fmt.Errorf("go.mod pins %s, but go is %s: release binaries are built with the pinned toolchain only (set GOTOOLCHAIN=%s)", want, have, want)
	}
	dir := StageDir(root)
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	// One build for all of them (scripts/static-build, the images'
	// recipe too), each named for its main package's directory.
	args := []string{filepath.Join(root, "scripts", "static-build"), dir}
	for name, pkg := range Binaries {
		if filepath.Base(pkg) != name {
			return fmt.Errorf("executable %s is built from %s, whose directory names it otherwise", name, pkg)
		}
		args = append(args, pkg)
	}
	cmd := exec.Command("bash", args...)
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("building the package's executables: %v\n%s", err, msg)
	}
	for name := range Binaries {
		if _, err := os.Stat(filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("building %s: %w", name, err)
		}
	}
	return nil
}

// pinnedGo reads the go directive of root/go.mod as a GOVERSION string.
func pinnedGo(root string) (string, error) {
	f, err := os.Open(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	defer f.Close()
	var goLine, toolchain string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 2 && fields[0] == "go" {
			goLine = "go" + fields[1]
		}
		if len(fields) == 2 && fields[0] == "toolchain" {
			toolchain = fields[1]
		}
	}
	if toolchain != "" {
		return toolchain, nil
	}
	if strings.Count(goLine, ".") < 2 {
		return "", fmt.Errorf("go.mod: the go directive must name a patch release (go 1.x.y) to pin the toolchain, got %q", goLine)
	}
	return goLine, nil
}
