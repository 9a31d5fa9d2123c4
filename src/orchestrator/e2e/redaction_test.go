package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// A Gitea and a GitHub forge configured at URLs with secrets in their
// user info and query (a token in the URL, as some proxies take it), both
// down: every pass fails naming the URL. No output of `runway serve` or
// the CLI carries those secrets — the daemon's log (whose lines still
// split into their fields), the API, the page, /metrics, `runway status`
// and `runway runners` (tables and -json), `runway check`, and the error
// of a serve refusing such a URL — and each keeps the path that says
// where the request went.
func TestURLSecretsStayOutOfEveryOutput(t *testing.T) {
	url := forgetest.CanaryURL(t)
	e := newEnv(t)
	token := filepath.Join(e.dir, "api-token")
	e.forgeYML = fmt.Sprintf(`
  - {name: tea, type: gitea, url: %q, token_file: %s, poll_interval: 200ms}
  - {name: hub, type: github, url: %q, token_file: %s, poll_interval: 200ms}`, url, token, url, token)
	e.writeConfig("200ms", e.group("tea", "forge: tea\n    scope: org\n    org: acme", []string{"linux"}, 1, ""),
		e.group("hub", "forge: hub\n    scope: org\n    org: acme", []string{"linux"}, 1, ""))
	e.start()
	e.eventually(30*time.Second, "both groups failing at their forge", func() bool {
		return e.groupStatus("tea").LastError != "" && e.groupStatus("hub").LastError != ""
	})
	outputs := map[string]string{}
	for _, p := range []string{"/api/v1/groups", "/api/v1/runners?all=true", "/", "/metrics"} {
		outputs["GET "+p] = e.fetch(p)
	}
	for _, args := range [][]string{{"status"}, {"status", "-json"}, {"runners", "-all"}, {"runners", "-all", "-json"}, {"check"}} {
		out, _ := e.runway(append(args, "-config", e.cfgPath)...)
		outputs["runway "+strings.Join(args, " ")] = out
	}
	if !json.Valid([]byte(outputs["runway status -json"])) {
		t.Errorf("runway status -json is not JSON:\n%s", outputs["runway status -json"])
	}
	bad := filepath.Join(e.dir, "bad.yml")
	cfg, _ := os.ReadFile(e.cfgPath)
	must(t, os.WriteFile(bad, []byte(strings.ReplaceAll(string(cfg), "http://canary-user", "ftp://canary-user")), 0o600))
	outputs["runway serve refusing the URL"], _ = e.runway("serve", "-config", bad)
	e.stop(false)
	outputs["runway serve's log"] = e.stderr.String()
	for what, text := range outputs {
		if strings.Contains(text, "canary") {
			t.Errorf("%s carries a secret of the forge URL:\n%s", what, text)
		}
	}
	for _, what := range []string{"GET /api/v1/groups", "runway status", "runway status -json", "runway check", "runway serve refusing the URL", "runway serve's log"} {
		if !strings.Contains(outputs[what], "/keep-this-segment") {
			t.Errorf("%s lost the URL's path:\n%s", what, outputs[what])
		}
	}
	logFieldsSplit(t, outputs["runway serve's log"])
}

// logFieldsSplit fails t for a log line about a failed pass whose err
// value does not read back as one quoted string naming the URL's path.
func logFieldsSplit(t *testing.T, log string) {
	t.Helper()
	n := 0
	for _, line := range strings.Split(log, "\n") {
		_, v, ok := strings.Cut(line, "reconcile failed; backing off group=")
		if !ok {
			continue
		}
		n++
		_, v, _ = strings.Cut(v, " err=")
		q, err := strconv.QuotedPrefix(v)
		msg, uerr := strconv.Unquote(q)
		if err != nil || uerr != nil || !strings.Contains(msg, "/keep-this-segment") || !strings.HasPrefix(v[len(q):], " retry_in=") {
			t.Errorf("the err field of %q does not read back (%v, %v): %q", line, err, uerr, msg)
		}
	}
	if n == 0 {
		t.Errorf("no failed pass logged:\n%s", log)
	}
}

// fetch GETs path from the daemon ("" when it cannot be read).
func (e *env) fetch(path string) string {
	resp, err := http.Get("http://" + e.addr + path)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// Secrets stay out of the daemon's output, its API and the CPI's logs.
func TestSecretsStayOut(t *testing.T) {
	e := newEnv(t)
	e.writeConfig("200ms", e.group("quiet", "scope: org\n    org: acme", []string{"linux"}, 2, ""))
	job := e.gitea.AddJob("acme/app", "build", []string{"linux"}, "queued")
	e.start()
	e.eventually(60*time.Second, "the job completes", completed(e, job))
	e.eventually(30*time.Second, "cleaned up", func() bool { return len(e.runners(false)) == 0 })
	// The registration token Gitea hands out for the org scope.
	reg := regToken(e)
	var api strings.Builder
	for _, p := range []string{"/api/v1/runners?all=true", "/api/v1/groups", "/metrics"} {
		var v any
		if p == "/metrics" {
			continue
		}
		e.get(p, &v)
		fmt.Fprint(&api, v)
	}
	for what, text := range map[string]string{"daemon output": e.stderr.String(), "API": api.String()} {
		for _, s := range []string{reg, apiToken, webhookSecret} {
			if strings.Contains(text, s) {
				t.Errorf("%s contains a secret (%.6s...)", what, s)
			}
		}
	}
	filepath.Walk(filepath.Join(e.dir, "cpi-state"), func(p string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() || !strings.HasSuffix(p, ".log") {
			return nil
		}
		b, _ := os.ReadFile(p)
		if strings.Contains(string(b), reg) {
			t.Errorf("%s contains the registration token", p)
		}
		return nil
	})
}

// regToken is the scope's registration token, as the forge hands it out.
func regToken(e *env) string { return e.gitea.RegistrationToken("/orgs/acme") }
