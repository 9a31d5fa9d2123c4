package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// envMarker is set in every VM process so that a process group is only ever
// signalled after it is proven to belong to that VM (guards PID reuse).
const envMarker = "RUNWAY_VM_CID"

// wrapper runs the VM's command detached: the outer sh is the session and
// group leader; it records its pid (= the group id) before anything else,
// backgrounds a subshell that runs the command and records its exit status,
// and exits at once. The group outlives bin/cpi and is reaped by init.
const wrapper = `echo $$ > "$RUNWAY_VM_DIR/pgid.tmp" && mv "$RUNWAY_VM_DIR/pgid.tmp" "$RUNWAY_VM_DIR/pgid" || exit 1
rm -f "$RUNWAY_VM_DIR/exit_status"
( "$@"; echo $? > "$RUNWAY_VM_DIR/exit_status" ) </dev/null >>"$RUNWAY_VM_DIR/console.log" 2>&1 &
`

// startProcess launches argv for the VM in vmDir with env.
func startProcess(vmDir string, argv, env []string) error {
	cmd := exec.Command("/bin/sh", append([]string{"-c", wrapper, "runway-vm"}, argv...)...)
	cmd.Dir = vmDir
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	// stdin/stdout/stderr are /dev/null: the VM must never inherit bin/cpi's
	// stdout, which carries the response.
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("starting vm process: %w", err)
	}
	if _, err := os.Stat(filepath.Join(vmDir, "pgid")); err != nil {
		return fmt.Errorf("vm process did not record its group: %w", err)
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

// liveMembers lists the non-zombie processes of group pgid that carry the
// VM's marker. Linux-only: it reads /proc.
func liveMembers(pgid int, cid string) []int {
	if pgid <= 1 {
		return nil
	}
	// Fast path: an empty group needs no /proc scan.
	if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
		return nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	marker := []byte(envMarker + "=" + cid + "\x00")
	var out []int
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
		if len(f) < 3 || f[0] == "Z" || f[0] == "X" || f[2] != strconv.Itoa(pgid) {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(append(env, 0), marker) {
			continue
		}
		out = append(out, pid)
	}
	return out
}

// stopGroup ends the VM's processes: SIGTERM, grace, SIGKILL. It returns
// only when none is left ("deletion must be certain").
func stopGroup(ctx context.Context, pgid int, cid string, grace time.Duration) error {
	if len(liveMembers(pgid, cid)) == 0 {
		return nil
	}
	if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("signalling vm processes (group %d): %w", pgid, err)
	}
	if waitGone(ctx, pgid, cid, grace) {
		return nil
	}
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("killing vm processes (group %d): %w", pgid, err)
	}
	if waitGone(ctx, pgid, cid, 10*time.Second) {
		return nil
	}
	return fmt.Errorf("vm processes (group %d) still alive after SIGKILL", pgid)
}

// waitGone polls with a growing interval: processes that honour SIGTERM are
// usually gone within a millisecond or two.
func waitGone(ctx context.Context, pgid int, cid string, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	step := 500 * time.Microsecond
	for {
		if len(liveMembers(pgid, cid)) == 0 {
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
