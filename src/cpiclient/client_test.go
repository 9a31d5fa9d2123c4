package cpiclient

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/rpc"
)

// fakeCPI writes a shell script standing in for a CPI executable.
func fakeCPI(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "cpi")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

// The request is what the Director sends (method, positional arguments,
// context with director_uuid, request_id and the stemcell API version),
// on stdin, with -configPath, in a cleared environment.
func TestRequestAsTheDirectorSendsIt(t *testing.T) {
	dir := t.TempDir()
	cpi := fakeCPI(t, `cat > `+dir+`/request; echo "$@" > `+dir+`/argv; env > `+dir+`/env
echo '{"result": ["vm-1", {}], "error": null, "log": "ok"}'`)
	t.Setenv("RUNWAY_SECRET_IN_CALLER", "s3cret")
	c := &Client{Path: cpi, ConfigPath: "/etc/cpi.json", DirectorUUID: "dir-1", APIVersion: 2, StemcellAPIVersion: 2}
	resp, err := c.Call(context.Background(), "create_vm", "cpi-42", "agent", "sc", map[string]any{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if string(resp.Result) != `["vm-1", {}]` || resp.Log != "ok" {
		t.Errorf("reply %+v", resp.Reply)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "request"))
	req, werr := rpc.ParseRequest(b)
	if werr != nil {
		t.Fatalf("the request does not parse: %v\n%s", werr, b)
	}
	if req.Method != "create_vm" || req.APIVersion != 2 || len(req.Arguments) != 4 || req.DirectorUUID() != "dir-1" ||
		req.Context["request_id"] != "cpi-42" || req.StemcellAPIVersion() != 2 {
		t.Errorf("request %s", b)
	}
	if argv, _ := os.ReadFile(filepath.Join(dir, "argv")); strings.TrimSpace(string(argv)) != "-configPath /etc/cpi.json" {
		t.Errorf("argv %q", argv)
	}
	env, _ := os.ReadFile(filepath.Join(dir, "env"))
	if strings.Contains(string(env), "s3cret") || !strings.Contains(string(env), "PATH=/usr/sbin:/usr/bin:/sbin:/bin") {
		t.Errorf("the caller's environment leaked or PATH is missing:\n%s", env)
	}
}

// A CPI error answer is returned both in the response and as *rpc.Error;
// a process that writes no valid response is a transport error.
func TestErrorsAndBadAnswers(t *testing.T) {
	c := &Client{Path: fakeCPI(t, `echo '{"result": null, "error": {"type": "Bosh::Clouds::VMNotFound", "message": "gone", "ok_to_retry": false}, "log": ""}'`)}
	resp, err := c.Call(context.Background(), "has_vm", "", "vm-1")
	var we *rpc.Error
	if !errors.As(err, &we) || we.Type != rpc.TypeVMNotFound || resp.Error == nil || resp.Error.Message != "gone" {
		t.Fatalf("error answer: %v %+v", err, resp)
	}
	for name, body := range map[string]string{
		"nothing":       "exit 1",
		"not JSON":      "echo hello",
		"two documents": `echo '{"result": 1, "error": null, "log": ""}{"result": 2, "error": null, "log": ""}'`,
		"no log":        `echo '{"result": 1, "error": null}'`,
	} {
		c := &Client{Path: fakeCPI(t, "echo on stderr >&2\n"+body)}
		resp, err := c.Call(context.Background(), "info", "")
		if err == nil || errors.As(err, &we) {
			t.Errorf("%s: %v, want a transport error", name, err)
		}
		if resp == nil || !strings.Contains(resp.Stderr, "on stderr") {
			t.Errorf("%s: stderr not kept: %+v", name, resp)
		}
	}
}

// Past the timeout the whole process group is killed: a child the CPI
// started does not outlive the call.
func TestTimeoutKillsTheProcessGroup(t *testing.T) {
	dir := t.TempDir()
	c := &Client{Path: fakeCPI(t, `sleep 600 & echo $! > `+dir+`/child; wait`), Timeout: 300 * time.Millisecond}
	_, err := c.Call(context.Background(), "info", "")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the deadline", err)
	}
	b, _ := os.ReadFile(filepath.Join(dir, "child"))
	pid := strings.TrimSpace(string(b))
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil || strings.Contains(string(st), ") Z ") {
			break // gone, or a zombie waiting for init
		}
		if time.Now().After(deadline) {
			t.Fatalf("the CPI's child %s survived the timeout", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Arguments that cannot be encoded fail before any process starts.
func TestUnencodableArguments(t *testing.T) {
	dir := t.TempDir()
	c := &Client{Path: fakeCPI(t, "touch "+dir+"/ran")}
	if _, err := c.Call(context.Background(), "info", "", make(chan int)); err == nil {
		t.Fatal("a channel argument was accepted")
	}
	if _, err := os.Stat(filepath.Join(dir, "ran")); err == nil {
		t.Error("the CPI ran")
	}
}
