// Package procs finds and stops a local VM's processes on the host, in
// either isolation mode: a process VM's process group, a container VM's
// supervisor. Every VM process carries the VM's marker in its
// environment, so a process is signalled only once it is proven the
// VM's (a recycled pid never is), and a VM's processes are found even
// when their group was never recorded.
package procs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// EnvMarker is set in every VM process (and a container VM's supervisor
// and runtime) to the VM's CID.
const EnvMarker = "RUNWAY_VM_CID"

// VMPath is the PATH VM processes get.
const VMPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// ReadPGID returns the recorded process group, 0 when none.
func ReadPGID(vmDir string) int {
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
	marker := []byte(EnvMarker + "=" + cid + "\x00")
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

// LiveMembers lists the marked processes of group pgid: whether the VM
// runs. An empty group answers without a /proc scan.
func LiveMembers(pgid int, cid string) []int {
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

// Stop ends every process of the VM: SIGTERM, grace, SIGKILL. It returns
// only when none is left ("deletion must be certain"). With its group
// recorded, the VM's processes are that group's members that carry the
// marker (a cheap check while the group is empty); without (bin/cpi killed
// while starting the VM), every process carrying the marker, and their
// groups.
func Stop(ctx context.Context, cid string, pgid int, grace time.Duration) error {
	find := func() ([]int, []int) { return vmTargets(cid) }
	if pgid > 1 {
		find = func() ([]int, []int) {
			if pids := LiveMembers(pgid, cid); len(pids) > 0 {
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

// HasMarker: process pid carries cid's marker.
func HasMarker(pid int, cid string) bool {
	env, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	return err == nil && bytes.Contains(append(env, 0), []byte(EnvMarker+"="+cid+"\x00"))
}

// StopLeader ends the process group led by pid, a process of VM cid that
// leads it (a container VM's supervisor): SIGTERM to the group, the
// leader's exit awaited on a pidfd (no scan of /proc, however many
// processes the host runs), SIGKILL after grace. It answers false when it
// cannot tell (no pidfd): the caller scans instead.
func StopLeader(ctx context.Context, cid string, pid int, grace time.Duration) (bool, error) {
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
	if !HasMarker(pid, cid) {
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
