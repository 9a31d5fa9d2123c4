package container

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/runway-cpi/runway/src/driver/local/procs"
)

// Runtime is the OCI runtime's executable (runc or crun) and its state
// root (kept under the driver's state dir).
type Runtime struct {
	Path, Root string
}

// Run runs the runtime with args and returns its combined output.
func (r Runtime) Run(ctx context.Context, args ...string) ([]byte, error) {
	rt := r.Path
	if rt == "" { // process mode now, deleting a VM made in container mode
		for _, name := range []string{"runc", "crun"} {
			if p, err := exec.LookPath(name); err == nil {
				rt = p
				break
			}
		}
		if rt == "" {
			return nil, errors.New("no OCI runtime (runc, crun) on PATH")
		}
	}
	cmd := exec.CommandContext(ctx, rt, append([]string{"--root", r.Root}, args...)...)
	cmd.Env = []string{"PATH=" + procs.VMPath}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", filepath.Base(rt), args[0], err, bytes.TrimSpace(out))
	}
	return out, nil
}

// CgroupDirs lists a cgroup's directories on this host, under every v1
// controller hierarchy and the v2 one.
func CgroupDirs(cgroup string) []string {
	var out []string
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	hier = append(hier, "/sys/fs/cgroup")
	for _, h := range hier {
		p := filepath.Join(h, cgroup)
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

// KillCgroups kills every process left in the VM's cgroups and removes
// them.
func KillCgroups(ctx context.Context, cid, cgroup string) error {
	dirs := CgroupDirs(cgroup)
	if len(dirs) == 0 {
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		alive := false
		for _, dir := range dirs {
			b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					alive = true
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if !alive {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("processes of vm %s still in its cgroups after SIGKILL", cid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, dir := range dirs {
		if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing cgroup %s: %w", dir, err)
		}
	}
	return nil
}
