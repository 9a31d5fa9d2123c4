// Package cpiclient calls a BOSH CPI executable the way the Director does:
// one process per call, JSON on stdin, JSON on stdout, a cleared
// environment. It imports no driver: any BOSH CPI works.
package cpiclient

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"

	"github.com/runway-cpi/runway/src/rpc"
)

// Client runs one CPI executable.
type Client struct {
	Path       string // bin/cpi
	ConfigPath string // passed as -configPath when set
	// DirectorUUID goes into every request's context.
	DirectorUUID string
	APIVersion   int
	// StemcellAPIVersion, when > 0, is sent as context.vm.stemcell.api_version.
	StemcellAPIVersion int
	// Timeout bounds one call; the process group is killed past it.
	Timeout time.Duration
	// Env is the child's whole environment (default: the Director's).
	Env []string
}

// Response is one decoded answer (rpc.Reply) and how the call went.
type Response struct {
	rpc.Reply
	Stderr   string
	Duration time.Duration
}

// Call runs method with args. err is set for transport failures (the
// process could not run, timed out, or wrote no valid response); a CPI
// error answer is returned in Response.Error and as *rpc.Error.
func (c *Client) Call(ctx context.Context, method, requestID string, args ...any) (*Response, error) {
	reqCtx := map[string]any{"director_uuid": c.DirectorUUID}
	if requestID != "" {
		reqCtx["request_id"] = requestID
	}
	if c.StemcellAPIVersion > 0 {
		reqCtx["vm"] = map[string]any{"stemcell": map[string]any{"api_version": c.StemcellAPIVersion}}
	}
	req, err := rpc.NewRequest(method, c.APIVersion, reqCtx, args...)
	if err != nil {
		return nil, err
	}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	argv := []string{}
	if c.ConfigPath != "" {
		argv = append(argv, "-configPath", c.ConfigPath)
	}
	cmd := exec.CommandContext(ctx, c.Path, argv...)
	cmd.Env = c.Env
	if cmd.Env == nil {
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR=" + os.TempDir(), "HOME=" + os.Getenv("HOME")}
	}
	cmd.Stdin = bytes.NewReader(body)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	// Own process group, so a timeout kills whatever the CPI started too;
	// and killed with its caller, so a caller that dies mid-call (kill -9)
	// leaves no CPI running on that it cannot see finish.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 2 * time.Second
	start := time.Now()
	runErr := cmd.Run()
	resp := &Response{Stderr: stderr.String(), Duration: time.Since(start)}
	if ctx.Err() != nil {
		return resp, fmt.Errorf("cpi %s: %w after %s", method, ctx.Err(), resp.Duration.Round(time.Millisecond))
	}
	reply, err := rpc.ParseReply(stdout.Bytes())
	if err != nil {
		return resp, fmt.Errorf("cpi %s: no valid response (exit: %v): %w", method, runErr, err)
	}
	resp.Reply = *reply
	if resp.Error != nil {
		return resp, resp.Error
	}
	return resp, nil
}
