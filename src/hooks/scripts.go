package hooks

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/runway-cpi/runway/src/clip"
)

// scripts lists <dir>/<method>-<phase>.d in order. Names must match
// ^[a-zA-Z0-9_-]+$ (so dotfiles and editor backups are skipped);
// directories and non-executables are skipped too.
func (r *Runner) scripts(method, phase string) []string {
	if r.cfg.Dir == "" {
		return nil
	}
	dir := filepath.Join(r.cfg.Dir, method+"-"+phase+".d")
	entries, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			r.log.Warn("reading the hook directory failed", "dir", dir, "err", err)
		}
		return nil
	}
	var out []string
	for _, e := range entries {
		if !nameRe(e.Name()) {
			continue
		}
		st, err := os.Stat(filepath.Join(dir, e.Name()))
		if err != nil || !st.Mode().IsRegular() || st.Mode()&0o111 == 0 {
			continue
		}
		out = append(out, filepath.Join(dir, e.Name()))
	}
	sort.Strings(out)
	return out
}

// cappedWriter keeps at most n bytes and notes what it dropped.
type cappedWriter struct {
	mu      sync.Mutex
	w       io.Writer
	left    int64
	dropped int64
	tail    []byte // last output line, for messages
}

func (c *cappedWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.tail = append(c.tail, p...)
	if len(c.tail) > 4096 {
		c.tail = c.tail[len(c.tail)-4096:]
	}
	n := int64(len(p))
	if n > c.left {
		c.dropped += n - c.left
		p = p[:c.left]
	}
	c.left -= int64(len(p))
	if len(p) > 0 {
		if _, err := c.w.Write(p); err != nil {
			return 0, err
		}
	}
	return int(n), nil
}

func (c *cappedWriter) lastLine() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(string(c.tail)), "\n")
	return clip.Quote(lines[len(lines)-1], 200)
}

// logFile opens the call's script log (shared by its scripts, capped).
func (r *Runner) logFile(c *Call) (*cappedWriter, error) {
	if r.logf == nil {
		if err := os.MkdirAll(r.cfg.LogDir, 0o700); err != nil {
			return nil, err
		}
		id := c.RequestID
		if id == "" || !nameRe(id) {
			id = r.uid
		}
		name := fmt.Sprintf("%s-%s-%s.log", r.now().UTC().Format("20060102T150405"), id, c.Method)
		f, err := os.OpenFile(filepath.Join(r.cfg.LogDir, name), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return nil, err
		}
		r.logf = f
	}
	st, _ := r.logf.Stat()
	left := r.cfg.LogCapBytes
	if st != nil {
		left -= st.Size()
	}
	if left < 0 {
		left = 0
	}
	return &cappedWriter{w: r.logf, left: left}, nil
}

// runScript runs one script: cleared environment, stdin /dev/null, cwd /,
// output to the call's log file, its own process group, a timeout with
// SIGTERM → grace → SIGKILL, and whatever it left running killed after it.
func (r *Runner) runScript(ctx context.Context, c *Call, phase, path string, res *Result) hookResult {
	name := filepath.Base(filepath.Dir(path)) + "/" + filepath.Base(path)
	h := hookResult{kind: "script", name: name}
	start := r.now()
	defer func() { h.duration = r.now().Sub(start); r.record(c, phase, h) }()

	out, err := r.logFile(c)
	if err != nil {
		h.outcome, h.message = "fail", "cannot open hook log: "+err.Error()
		return h
	}
	fmt.Fprintf(out, "==> %s %s %s\n", r.now().UTC().Format(time.RFC3339), phase, name)
	pr, pw, err := os.Pipe()
	if err != nil {
		h.outcome, h.message = "fail", err.Error()
		return h
	}
	cmd := exec.Command(path)
	cmd.Env = r.env(c, phase, res)
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = pw, pw // a file, so Wait does not wait for stragglers holding it
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		h.outcome, h.message = "fail", err.Error()
		return h
	}
	pw.Close()
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(out, pr); close(copied) }()

	pgid := cmd.Process.Pid
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	timeout := time.Duration(r.cfg.ScriptTimeoutSeconds) * time.Second
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	var werr error
	timedOut := false
	select {
	case werr = <-done:
	case <-timer.C:
		timedOut = true
	case <-ctx.Done():
		timedOut = true
	}
	if timedOut {
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case werr = <-done:
		case <-time.After(time.Duration(r.cfg.ScriptGraceSeconds) * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			werr = <-done
		}
	}
	// Anything the script left behind in its group goes too: a forked
	// sleeper must not hold the hook (or the CPI) open.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	select {
	case <-copied:
	case <-time.After(time.Second):
	}
	pr.Close()
	if out.dropped > 0 {
		fmt.Fprintf(r.logf, "\n[runway: %d bytes of output dropped: log cap %d reached]\n", out.dropped, r.cfg.LogCapBytes)
	}

	code := cmd.ProcessState.ExitCode()
	h.exitCode = &code
	switch {
	case timedOut:
		h.outcome = "fail"
		h.message = fmt.Sprintf("timed out after %s", timeout)
	case werr == nil:
		h.outcome = "success"
	default:
		h.outcome = "fail"
		if phase == "pre" {
			h.outcome = "deny"
		}
		h.message = fmt.Sprintf("exit status %d", code)
		if last := out.lastLine(); last != "" && !bytes.HasPrefix([]byte(last), []byte("==> ")) {
			h.message += ": " + last
		}
	}
	return h
}
