package hooks

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/logging"
)

func known(m string) bool { return m == "create_vm" || m == "delete_vm" }

// setup parses a hooks section (with the state dir for defaults) and
// answers a runner for it and the hooks dir.
func setup(t *testing.T, section string) (*Runner, string) {
	t.Helper()
	state := t.TempDir()
	dir := filepath.Join(state, "hooks.d")
	if section == "" {
		section = fmt.Sprintf(`{"dir": %q, "script_timeout_seconds": 2, "script_grace_seconds": 1}`, dir)
	}
	cfg, err := ParseConfig(json.RawMessage(section), state, known)
	if err != nil {
		t.Fatal(err)
	}
	r := New(cfg, logging.Discard())
	t.Cleanup(r.Close)
	return r, dir
}

func script(t *testing.T, dir, method, phase, name, body string) {
	t.Helper()
	d := filepath.Join(dir, method+"-"+phase+".d")
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(d, name), []byte("#!/bin/sh\n"+body), 0o755); err != nil {
		t.Fatal(err)
	}
}

var vmCall = &Call{Method: "delete_vm", RequestID: "cpi-7", DirectorUUID: "dir-1", ObjectType: "vm",
	Args: []any{"vm-1"}, Scalars: map[string]string{"vm_cid": "vm-1"}, Context: map[string]any{"director_uuid": "dir-1"}}

// audit reads the audit log's lines.
func audit(t *testing.T, r *Runner) []auditLine {
	t.Helper()
	f, err := os.Open(r.cfg.AuditLog)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []auditLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l auditLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		out = append(out, l)
	}
	return out
}

// Pre scripts run in name order; the first to exit non-zero denies and
// the rest do not run. Names that are not plain (dotfiles, backups) and
// files that are not executable are skipped.
func TestPreScriptsOrderAndDeny(t *testing.T) {
	r, dir := setup(t, "")
	trail := filepath.Join(t.TempDir(), "trail")
	for _, n := range []string{"20-second", "10-first", "30-third"} {
		exit := "0"
		if n == "20-second" {
			exit = "3"
		}
		script(t, dir, "delete_vm", "pre", n, fmt.Sprintf("echo %s >> %s\necho refusing because of %s\nexit %s\n", n, trail, n, exit))
	}
	script(t, dir, "delete_vm", "pre", ".hidden", "echo hidden >> "+trail)
	script(t, dir, "delete_vm", "pre", "05-backup~", "echo backup >> "+trail)
	os.WriteFile(filepath.Join(dir, "delete_vm-pre.d", "00-plain"), []byte("echo plain >> "+trail), 0o644)

	v := r.Pre(context.Background(), vmCall)
	if !v.Deny || v.Hook != "script delete_vm-pre.d/20-second" || !strings.Contains(v.Message, "exit status 3: refusing because of 20-second") {
		t.Fatalf("verdict %+v", v)
	}
	if b, _ := os.ReadFile(trail); string(b) != "10-first\n20-second\n" {
		t.Errorf("ran %q", b)
	}
	lines := audit(t, r)
	if len(lines) != 2 || lines[0].Outcome != "success" || lines[1].Outcome != "deny" || *lines[1].ExitCode != 3 || lines[1].RequestID != "cpi-7" {
		t.Errorf("audit %+v", lines)
	}
}

// A script sees only the documented environment: the call's variables,
// a redacted request file, nothing of the caller's.
func TestScriptEnvironment(t *testing.T) {
	r, dir := setup(t, "")
	out := filepath.Join(t.TempDir(), "env")
	script(t, dir, "delete_vm", "post", "env", "env > "+out+"; cat \"$CPI_REQUEST_FILE\" >> "+out+"; pwd >> "+out)
	t.Setenv("RUNWAY_CALLER_SECRET", "s3cret")
	r.Post(context.Background(), vmCall, Result{Status: "error", ErrorType: "Bosh::Clouds::VMNotFound", ErrorMsg: "gone"})
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	got := string(b)
	for _, want := range []string{"CPI_HOOKS_PHASE=post", "CPI_OP_CODE=delete_vm", "CPI_OBJECT_TYPE=vm", "CPI_REQUEST_ID=cpi-7",
		"CPI_DIRECTOR_UUID=dir-1", "CPI_VM_CID=vm-1", "CPI_POST_STATUS=error", "CPI_POST_ERROR_TYPE=Bosh::Clouds::VMNotFound",
		"CPI_POST_ERROR_MESSAGE=gone", `"method":"delete_vm"`, `"arguments":["vm-1"]`, "PWD=/\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in:\n%s", want, got)
		}
	}
	if strings.Contains(got, "s3cret") || strings.Contains(got, "HOME=") {
		t.Errorf("the caller's environment reached the script:\n%s", got)
	}
}

// A script past its timeout is stopped (TERM, then KILL after the grace),
// with whatever it forked; the call goes on without it.
func TestScriptTimeoutKillsItsGroup(t *testing.T) {
	r, dir := setup(t, "")
	pidFile := filepath.Join(t.TempDir(), "pid")
	script(t, dir, "delete_vm", "pre", "hang", "trap '' TERM\nsleep 600 & echo $! > "+pidFile+"\nwait\n")
	start := time.Now()
	v := r.Pre(context.Background(), vmCall)
	if !v.Deny || !strings.Contains(v.Message, "timed out after 2s") {
		t.Fatalf("verdict %+v", v)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %s with a 2 s timeout and 1 s grace", took)
	}
	b, _ := os.ReadFile(pidFile)
	// SIGKILL was sent; wait for the kernel to finish the process.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		st, err := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/stat")
		if err != nil || strings.Contains(string(st), ") Z ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the script's child survived: %s", st)
		}
	}
}

// Script output goes to the call's log, capped.
func TestScriptLogCapped(t *testing.T) {
	state := t.TempDir()
	dir := filepath.Join(state, "d")
	r, _ := setup(t, fmt.Sprintf(`{"dir": %q, "log_dir": %q, "log_cap_bytes": 1000}`, dir, filepath.Join(state, "logs")))
	script(t, dir, "delete_vm", "post", "chatty", "head -c 5000 /dev/zero | tr '\\0' x\n")
	r.Post(context.Background(), vmCall, Result{Status: "success"})
	logs, _ := filepath.Glob(filepath.Join(state, "logs", "*-cpi-7-delete_vm.log"))
	if len(logs) != 1 {
		t.Fatalf("logs %v", logs)
	}
	b, _ := os.ReadFile(logs[0])
	if len(b) > 1200 || !strings.Contains(string(b), "bytes of output dropped: log cap 1000 reached") {
		t.Errorf("log of %d bytes:\n%.300s", len(b), b)
	}
}

// extension serves one HTTP extension answering with answer(request).
func extension(t *testing.T, answer func(HookRequest) (int, any)) (*httptest.Server, *[]HookRequest) {
	var seen []HookRequest
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var hr HookRequest
		b, _ := io.ReadAll(req.Body)
		json.Unmarshal(b, &hr)
		if want := "/ext/v1/" + hr.Phase + "/" + hr.Method; req.URL.Path != want {
			t.Errorf("path %s, want %s", req.URL.Path, want)
		}
		seen = append(seen, hr)
		code, body := answer(hr)
		w.WriteHeader(code)
		json.NewEncoder(w).Encode(body)
	}))
	t.Cleanup(srv.Close)
	return srv, &seen
}

func extSection(t *testing.T, exts ...string) string {
	return fmt.Sprintf(`{"extensions": [%s]}`, strings.Join(exts, ","))
}

// Extensions: Failure denies; a retry-after defers (the lowest wins);
// a call error denies unless failurePolicy is Ignore; the answer must
// echo the request's uid.
func TestExtensionVerdicts(t *testing.T) {
	ok := func(hr HookRequest) (int, any) {
		return 200, HookResponse{APIVersion: apiVersion, Kind: "HookResponse", UID: hr.UID, Status: "Success"}
	}
	deferring := func(n int) func(HookRequest) (int, any) {
		return func(hr HookRequest) (int, any) {
			return 200, HookResponse{UID: hr.UID, Status: "Success", RetryAfterSeconds: n, Message: fmt.Sprintf("wait %d", n)}
		}
	}
	for name, tc := range map[string]struct {
		answers []func(HookRequest) (int, any)
		policy  string
		want    Verdict
	}{
		"all allow": {answers: []func(HookRequest) (int, any){ok, ok}},
		"deny": {answers: []func(HookRequest) (int, any){ok, func(hr HookRequest) (int, any) {
			return 200, HookResponse{UID: hr.UID, Status: "Failure", Message: "maintenance"}
		}}, want: Verdict{Deny: true, Hook: "extension e1", Message: "maintenance"}},
		"defers": {answers: []func(HookRequest) (int, any){deferring(30), deferring(10)},
			want: Verdict{Hook: "extension e1", Message: "wait 10", RetryAfter: 10}},
		"HTTP 500": {answers: []func(HookRequest) (int, any){func(HookRequest) (int, any) { return 500, nil }},
			want: Verdict{Deny: true, Hook: "extension e0", Message: "answered HTTP 500"}},
		"HTTP 500 ignored": {answers: []func(HookRequest) (int, any){func(HookRequest) (int, any) { return 500, nil }}, policy: "Ignore"},
		"wrong uid": {answers: []func(HookRequest) (int, any){func(HookRequest) (int, any) { return 200, HookResponse{UID: "other", Status: "Success"} }},
			want: Verdict{Deny: true, Hook: "extension e0"}},
		"bad status": {answers: []func(HookRequest) (int, any){func(hr HookRequest) (int, any) { return 200, HookResponse{UID: hr.UID, Status: "Maybe"} }},
			want: Verdict{Deny: true, Hook: "extension e0"}},
	} {
		t.Run(name, func(t *testing.T) {
			var exts []string
			for i, a := range tc.answers {
				srv, _ := extension(t, a)
				exts = append(exts, fmt.Sprintf(`{"name": "e%d", "clientConfig": {"url": %q}, "failurePolicy": %q}`, i, srv.URL+"/ext", tc.policy))
			}
			r, _ := setup(t, extSection(t, exts...))
			v := r.Pre(context.Background(), vmCall)
			if v.Deny != tc.want.Deny || v.Hook != tc.want.Hook || v.RetryAfter != tc.want.RetryAfter ||
				(tc.want.Message != "" && v.Message != tc.want.Message) {
				t.Errorf("verdict %+v, want %+v", v, tc.want)
			}
		})
	}
}

// What an extension is sent: the call, redacted as given, its settings,
// and in post the outcome; operations and phases select the calls.
func TestExtensionRequestAndSelection(t *testing.T) {
	srv, seen := extension(t, func(hr HookRequest) (int, any) { return 200, HookResponse{UID: hr.UID, Status: "Success"} })
	r, _ := setup(t, extSection(t, fmt.Sprintf(`{"name": "only-delete-post", "operations": ["delete_vm"], "phases": ["post"],
		"clientConfig": {"url": %q}, "settings": {"team": "a"}}`, srv.URL+"/ext?token=hidden")))
	r.Pre(context.Background(), vmCall)
	r.Post(context.Background(), &Call{Method: "create_vm", ObjectType: "vm"}, Result{Status: "success"})
	r.Post(context.Background(), vmCall, Result{Status: "success", Value: nil})
	if len(*seen) != 1 {
		t.Fatalf("%d requests, want the delete_vm post only", len(*seen))
	}
	hr := (*seen)[0]
	if hr.Kind != "HookRequest" || hr.APIVersion != apiVersion || hr.Phase != "post" || hr.Method != "delete_vm" || hr.RequestID != "cpi-7" ||
		hr.ObjectType != "vm" || hr.Settings["team"] != "a" || hr.Result == nil || hr.Result.Status != "success" || len(hr.Arguments) != 1 {
		t.Errorf("request %+v", hr)
	}
}

// Errors name the field, and a URL's query (it may carry a token) never
// shows in one.
func TestConfigErrors(t *testing.T) {
	for section, want := range map[string]string{
		`{"dir": "relative"}`:            "hooks: dir: must be an absolute path",
		`{"script_timeout_seconds": -1}`: "must not be negative",
		`{"bogus": 1}`:                   "bogus",
		`{"extensions": [{"name": "a b", "clientConfig": {"url": "https://x"}}]}`:                                                    "extensions[0].name",
		`{"extensions": [{"name": "a", "clientConfig": {"url": "https://x"}}, {"name": "a", "clientConfig": {"url": "https://x"}}]}`: "duplicate extension",
		`{"extensions": [{"name": "a", "operations": ["nope"], "clientConfig": {"url": "https://x"}}]}`:                              "extensions[a].operations: unknown method \"nope\"",
		`{"extensions": [{"name": "a", "phases": ["during"], "clientConfig": {"url": "https://x"}}]}`:                                "extensions[a].phases",
		`{"extensions": [{"name": "a", "timeoutSeconds": 31, "clientConfig": {"url": "https://x"}}]}`:                                "extensions[a].timeoutSeconds: must be 1 to 30",
		`{"extensions": [{"name": "a", "failurePolicy": "Maybe", "clientConfig": {"url": "https://x"}}]}`:                            "extensions[a].failurePolicy",
		`{"extensions": [{"name": "a", "clientConfig": {"url": "http://example.com/h?token=abc"}}]}`:                                 "must use https (plain http is allowed for loopback only), got \"http://example.com/h\"",
		`{"extensions": [{"name": "a", "clientConfig": {"url": "https://u:p@example.com"}}]}`:                                        "must not carry credentials",
		`{"extensions": [{"name": "a", "clientConfig": {"url": "https://x", "caBundle": "nope"}}]}`:                                  "caBundle: holds no PEM certificate",
		`{"extensions": [{"name": "a", "clientConfig": {"url": "https://x", "clientCert": "/c"}}]}`:                                  "clientCert and clientKey go together",
	} {
		_, err := ParseConfig(json.RawMessage(section), "/var/state", known)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", section, err, want)
		}
		if err != nil && strings.Contains(err.Error(), "token=abc") {
			t.Errorf("%s: the query reached the error: %v", section, err)
		}
	}
	c, err := ParseConfig(json.RawMessage(`{}`), "/var/state", known)
	if err != nil || c.AuditLog != "/var/state/hooks/audit.jsonl" || c.LogDir != "/var/state/hooks/logs" ||
		c.ScriptTimeoutSeconds != DefaultScriptTimeout || c.LogCapBytes != DefaultLogCap {
		t.Errorf("defaults: %+v %v", c, err)
	}
}
