package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/runway-cpi/runway/src/driver/local/container"
	"github.com/runway-cpi/runway/src/driver/local/record"

	"golang.org/x/sys/unix"
)

// envMarker is set in every VM process: a process is only ever signalled
// after it is proven to belong to that VM (guards PID reuse), and a VM's
// processes are found by it even when their group is not known.
const envMarker = container.EnvMarker

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

// procStat reads a process's state and group; zombies (which stay forever
// where PID 1 does not reap) count as gone.
func procStat(pid string) (pgid int, alive bool) {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return 0, false
	}
	// Fields after the parenthesised command: state ppid pgrp ...
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 3 || f[0] == "Z" || f[0] == "X" {
		return 0, false
	}
	g, _ := strconv.Atoi(f[2])
	return g, true
}

// scan lists live processes that carry cid's marker (when withMarker), or
// are in one of groups. Reading every process's environment is the costly
// part: polls after the first look at groups only. Linux-only: /proc.
func scan(cid string, withMarker bool, groups ...int) []procInfo {
	return scanIn(cid, withMarker, false, groups...)
}

// scanIn is scan; with onlyGroups, processes outside groups are skipped
// before their environment is read.
func scanIn(cid string, withMarker, onlyGroups bool, groups ...int) []procInfo {
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
		g, alive := procStat(e.Name())
		if !alive {
			continue
		}
		inGroup := g > 1 && slices.Contains(groups, g)
		if onlyGroups && !inGroup {
			continue
		}
		marked := false
		if withMarker {
			env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
			marked = err == nil && bytes.Contains(append(env, 0), marker)
		}
		if marked || inGroup {
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
	for _, p := range scanIn(cid, true, true, pgid) {
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
	for _, p := range scan(cid, true) {
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
// only when none is left ("deletion must be certain"). With its group
// recorded, the VM's processes are that group's members that carry the
// marker (a cheap check while the group is empty); without (bin/cpi killed
// while starting the VM), every process carrying the marker, and their
// groups.
func stopVM(ctx context.Context, cid string, pgid int, grace time.Duration) error {
	find := func() ([]int, []int) { return vmTargets(cid) }
	if pgid > 1 {
		find = func() ([]int, []int) {
			if pids := liveMembers(pgid, cid); len(pids) > 0 {
				return pids, []int{pgid}
			}
			return nil, nil
		}
	}
	pids, groups := find()
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
	// With the group known, its members are all there is to wait for;
	// found by marker, a last look makes sure none forked away.
	done := func() bool {
		if pgid > 1 {
			return true
		}
		p, _ := find()
		return len(p) == 0
	}
	signal(syscall.SIGTERM)
	if waitGone(ctx, pids, groups, grace) && done() {
		return nil
	}
	// Processes may have forked or left their group meanwhile: look again
	// before killing.
	for range 3 {
		pids, groups = find()
		if len(pids) == 0 {
			return nil
		}
		signal(syscall.SIGKILL)
		if waitGone(ctx, pids, groups, 10*time.Second/3) && done() {
			return nil
		}
	}
	if pids, _ = find(); len(pids) == 0 {
		return nil
	}
	return fmt.Errorf("processes of vm %s still alive after SIGKILL", cid)
}

// waitGone polls with a growing interval until none of pids is alive and
// groups have no live member: processes that honour SIGTERM are usually
// gone within a millisecond or two.
func waitGone(ctx context.Context, pids, groups []int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	step := 500 * time.Microsecond
	for {
		if !anyAlive(pids, groups) {
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

// anyAlive reports whether a process of pids or a member of groups still
// runs. kill(0) answers at once for what is gone; only a group that still
// has members (maybe zombies, which do not count) needs a /proc scan.
func anyAlive(pids, groups []int) bool {
	var busy []int
	for _, g := range groups {
		if err := syscall.Kill(-g, 0); !errors.Is(err, syscall.ESRCH) {
			busy = append(busy, g)
		}
	}
	if len(busy) > 0 && len(scan("", false, busy...)) > 0 {
		return true
	}
	for _, p := range pids {
		if err := syscall.Kill(p, 0); !errors.Is(err, syscall.ESRCH) {
			if _, ok := procStat(strconv.Itoa(p)); ok {
				return true
			}
		}
	}
	return false
}

// hasMarker: process pid carries cid's marker.
func hasMarker(pid int, cid string) bool {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	return err == nil && bytes.Contains(append(env, 0), []byte(envMarker+"="+cid+"\x00"))
}

// stopLeader ends the process group led by pid, a process of VM cid that
// leads it (a container VM's supervisor): SIGTERM to the group, the
// leader's exit awaited on a pidfd (no scan of /proc, however many
// processes the host runs), SIGKILL after grace. It answers false when it
// cannot tell (no pidfd): the caller scans instead.
func stopLeader(ctx context.Context, cid string, pid int, grace time.Duration) (bool, error) {
	if pid <= 1 {
		return false, nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if errors.Is(err, unix.ESRCH) {
		return true, nil // gone
	}
	if err != nil {
		return false, nil
	}
	defer unix.Close(fd)
	// The pidfd holds the process: a recycled pid is not the VM's.
	if !hasMarker(pid, cid) {
		return true, nil
	}
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	if exited(ctx, fd, grace) {
		return true, nil
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	if exited(ctx, fd, 10*time.Second) {
		return true, nil
	}
	return true, fmt.Errorf("the supervisor of vm %s (pid %d) still runs after SIGKILL", cid, pid)
}

// exited waits up to limit for the process of pidfd fd to exit.
func exited(ctx context.Context, fd int, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for {
		left := time.Until(deadline)
		if left <= 0 || ctx.Err() != nil {
			return false
		}
		if left > 100*time.Millisecond {
			left = 100 * time.Millisecond // ctx is looked at between polls
		}
		n, err := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, int(left.Milliseconds())+1)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return false
		}
		if n > 0 {
			return true
		}
	}
}
