package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// envMarker is set in every VM process: a process is only ever signalled
// after it is proven to belong to that VM (guards PID reuse), and a VM's
// processes are found by it even when their group is not known.
const envMarker = "RUNWAY_VM_CID"

// wrapper runs the VM's command detached: sh leads its own session and
// group, starts the command only if the VM still exists, records its exit
// status, and exits at once. Shell builtins only: nothing on the VM's PATH
// runs before the command.
const wrapper = `[ -f "$RUNWAY_VM_DIR/vm.json" ] || exit 1
( "$@"; echo $? > "$RUNWAY_VM_DIR/exit_status" ) </dev/null >>"$RUNWAY_VM_DIR/console.log" 2>&1 &
`

// startProcess launches argv for the VM in vmDir with env and records its
// process group (the wrapper's pid) itself, at once: if bin/cpi is killed
// before that, the VM's processes are still found by their marker.
func startProcess(vmDir string, argv, env []string) error {
	_ = os.Remove(filepath.Join(vmDir, "exit_status"))
	cmd := exec.Command("/bin/sh", append([]string{"-c", wrapper, "runway-vm"}, argv...)...)
	cmd.Dir = vmDir
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// stdin/stdout/stderr are /dev/null: the VM must never inherit bin/cpi's
	// stdout, which carries the response.
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting vm process: %w", err)
	}
	if err := writeFileAtomic(filepath.Join(vmDir, "pgid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n")); err != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return fmt.Errorf("recording the vm's process group: %w", err)
	}
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("starting vm process: %w", err)
	}
	return nil
}

// readPGID returns the recorded process group, 0 when none.
func readPGID(vmDir string) int {
	b, err := os.ReadFile(filepath.Join(vmDir, "pgid"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// procInfo is one live process: its pid, group and whether it carries the
// VM's marker.
type procInfo struct {
	pid, pgid int
	marked    bool
}

// scan lists live (non-zombie) processes that carry cid's marker, or are
// in one of groups. Zombies do not count: where PID 1 does not reap, they
// stay forever. Linux-only: it reads /proc.
func scan(cid string, groups ...int) []procInfo {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	marker := []byte(envMarker + "=" + cid + "\x00")
	var out []procInfo
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// Fields after the parenthesised command: state ppid pgrp ...
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
			continue
		}
		g, _ := strconv.Atoi(f[2])
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		marked := err == nil && bytes.Contains(append(env, 0), marker)
		if marked || (g > 1 && slices.Contains(groups, g)) {
			out = append(out, procInfo{pid: pid, pgid: g, marked: marked})
		}
	}
	return out
}

// liveMembers lists the marked processes of group pgid: whether the VM
// runs. An empty group answers without a /proc scan.
func liveMembers(pgid int, cid string) []int {
	if pgid <= 1 {
		return nil
	}
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return nil
	}
	var out []int
	for _, p := range scan(cid) {
		if p.marked && p.pgid == pgid {
			out = append(out, p.pid)
		}
	}
	return out
}

// vmTargets answers what to signal for the VM: every marked process, and
// every group that holds one (members that dropped the marker go with
// their group). A group with no marked member is never signalled.
func vmTargets(cid string) (pids, groups []int) {
	seen := map[int]bool{}
	for _, p := range scan(cid) {
		if !p.marked {
			continue
		}
		pids = append(pids, p.pid)
		if p.pgid > 1 && !seen[p.pgid] {
			seen[p.pgid] = true
			groups = append(groups, p.pgid)
		}
	}
	return pids, groups
}

// stopVM ends every process of the VM: SIGTERM, grace, SIGKILL. It returns
// only when none is left ("deletion must be certain"). It finds processes
// by marker, so a VM whose group was never recorded (bin/cpi killed while
// starting it) is stopped too.
func stopVM(ctx context.Context, cid string, grace time.Duration) error {
	pids, groups := vmTargets(cid)
	if len(pids) == 0 {
		return nil
	}
	signal := func(sig syscall.Signal) {
		for _, g := range groups {
			_ = syscall.Kill(-g, sig)
		}
		for _, p := range pids {
			_ = syscall.Kill(p, sig)
		}
	}
	signal(syscall.SIGTERM)
	if waitGone(ctx, cid, groups, grace) {
		return nil
	}
	// Processes may have forked meanwhile: look again before killing.
	for range 3 {
		pids, groups = vmTargets(cid)
		signal(syscall.SIGKILL)
		if waitGone(ctx, cid, groups, 10*time.Second/3) {
			return nil
		}
	}
	return fmt.Errorf("processes of vm %s still alive after SIGKILL", cid)
}

// waitGone polls with a growing interval until no marked process and no
// live member of groups is left: processes that honour SIGTERM are usually gone
// within a millisecond or two.
func waitGone(ctx context.Context, cid string, groups []int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	step := 500 * time.Microsecond
	for {
		if len(scan(cid, groups...)) == 0 {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(step)
		if step < 50*time.Millisecond {
			step *= 2
		}
	}
}
