package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
)

// runway status and runway runners print no URL's user info or query
// values even when the daemon answers them unredacted (a daemon older
// than the CLI), in tables and -json alike; the URL's path stays.
func TestCLIRedactsWhatTheDaemonAnswers(t *testing.T) {
	const raw = `Get \"http://canary-user:canary-pass@gitea.example/keep-this-segment?token=canary-query\": EOF`
	daemon := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/api/v1/groups":
			io.WriteString(w, `[{"name": "g", "scope": "org acme", "last_error": "`+raw+`"}]`)
		case "/api/v1/runners":
			io.WriteString(w, `[{"name": "g-abc", "group": "g", "state": "deleted", "reason": "`+raw+`", "last_error": "`+raw+`"}]`)
		}
	}))
	defer daemon.Close()
	addr := strings.TrimPrefix(daemon.URL, "http://")
	for _, run := range []struct {
		name string
		cmd  func([]string) error
		args []string
	}{
		{"status", statusCmd, nil}, {"status -json", statusCmd, []string{"-json"}},
		{"runners -all", runnersCmd, []string{"-all"}}, {"runners -all -json", runnersCmd, []string{"-all", "-json"}},
	} {
		out := stdout(t, func() error { return run.cmd(append(run.args, "-addr", addr, "-config", "/nonexistent")) })
		if strings.Contains(out, "canary") || !strings.Contains(out, "/keep-this-segment?token=<redacted>") {
			t.Errorf("runway %s printed:\n%s", run.name, out)
		}
	}
}

// stdout runs f and answers what it printed on os.Stdout.
func stdout(t *testing.T, f func() error) string {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stdout
	os.Stdout = w
	out := make(chan string)
	go func() { b, _ := io.ReadAll(r); out <- string(b) }()
	ferr := f()
	os.Stdout = saved
	w.Close()
	if ferr != nil {
		t.Fatal(ferr)
	}
	return <-out
}
