package procvm

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/runway-cpi/runway/src/driver/local/procs"
	"github.com/runway-cpi/runway/src/driver/local/record"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// wrapper runs the VM's command detached: sh leads its own session and
// group, starts the command only if the VM still exists, records its exit
// status, and exits at once. Its first two arguments are the console
// writer (the driver's executable: console.Served) and the console's cap;
// the VM's output goes through it into console.log, capped and rotated.
// Shell builtins only: nothing on the VM's PATH runs before the command.
const wrapper = `[ -f "$RUNWAY_VM_DIR/vm.json" ] || exit 1
w=$1 m=$2; shift 2
( ( "$@"; echo $? > "$RUNWAY_VM_DIR/exit_status" ) </dev/null 2>&1 | RUNWAY_CONSOLE_LOG="$RUNWAY_VM_DIR/console.log" RUNWAY_CONSOLE_MAX="$m" "$w" ) &
`

// startProcess launches argv for the VM in vmDir with env and records its
// process group (the wrapper's pid) itself, at once: if bin/cpi is killed
// before that, the VM's processes are still found by their marker. Its
// output reaches console.log through writer, capped at max bytes.
func startProcess(vmDir string, argv, env []string, writer string, max int64) error {
	_ = os.Remove(filepath.Join(vmDir, "exit_status"))
	cmd := exec.Command("/bin/sh", append([]string{"-c", wrapper, "runway-vm", writer, strconv.FormatInt(max, 10)}, argv...)...)
	cmd.Dir = vmDir
	cmd.Env = env
	// Pdeathsig: a bin/cpi killed while the wrapper is between fork and
	// exec takes the wrapper with it. Until its exec the child carries
	// bin/cpi's environment, not the VM's marker, so a delete_vm then could
	// not find it, and it would start the command after the delete. The
	// wrapper's own children (the VM) do not inherit it. The signal follows
	// the forking thread: the goroutine keeps its thread until the wrapper
	// has exited.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Pdeathsig: syscall.SIGKILL}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// stdin/stdout/stderr are /dev/null: the VM must never inherit bin/cpi's
	// stdout, which carries the response.
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting vm process: %w", err)
	}
	if err := record.WriteFile(filepath.Join(vmDir, "pgid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n")); err != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return fmt.Errorf("recording the vm's process group: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("starting vm process: %w", err)
	}
	return nil
}

// env is the VM process's whole environment: nothing of bin/cpi's
// own environment (which may hold credentials) is inherited.
func (p *VMs) env(rec store.VM, props store.VMProps) []string {
	dir := p.Store.Dir(store.VMs, rec.CID)
	env := map[string]string{
		"PATH":                  procs.VMPath,
		"HOME":                  dir,
		"RUNWAY_VM_DIR":         dir,
		procs.EnvMarker:         rec.CID,
		"RUNWAY_AGENT_ID":       rec.AgentID,
		"RUNWAY_DISKS_DIR":      filepath.Join(dir, "disks"),
		"RUNWAY_EPHEMERAL_DIR":  filepath.Join(dir, "ephemeral"),
		"RUNWAY_STEMCELL_DIR":   p.Store.ImageDir(rec.StemcellCID),
		"RUNWAY_AGENT_SETTINGS": filepath.Join(dir, "agent-settings.json"),
	}
	for k, v := range props.Env {
		if k != procs.EnvMarker && k != "RUNWAY_VM_DIR" {
			env[k] = v
		}
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// findExecutable checks the command exists before the VM is made: once it
// is started detached, a failed exec could only show in the console log.
func findExecutable(name string) error {
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) {
			return nil // relative to the VM directory: checked by the process
		}
		if st, err := os.Stat(name); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("command %s is not an executable file", name)
		}
		return nil
	}
	for _, dir := range filepath.SplitList(procs.VMPath) {
		if st, err := os.Stat(filepath.Join(dir, name)); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return nil
		}
	}
	return fmt.Errorf("command %q not found in %s", name, procs.VMPath)
}

func redactArgv(argv []string) []string {
	if len(argv) > 3 {
		return append(append([]string{}, argv[:3]...), "...")
	}
	return argv
}
