package orchestrator

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/gitea"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// A forge URL aimed at something else answers with its own words: the
// operator's status keeps them (LastError), the group author's does not
// (LastErrorBrief, which the Kubernetes controller writes on the
// object): only the request and its HTTP status.
func TestLastErrorBriefHasNothingTheForgeSaid(t *testing.T) {
	const marker = "metadata-credentials-6d0e"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, `{"message":"%s"}`, marker)
	}))
	defer srv.Close()
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(`
state_dir: %s
cpi: {path: /nonexistent}
forges:
  - {name: gitea, type: gitea, url: %q, token_env: UNUSED, poll_interval: 100ms}
groups:
  - {name: a, scope: org, org: acme, labels: [linux], max_active_runners: 1, stemcell: {cid: sc-1}, runner: {command: /bin/true}}
`, t.TempDir(), srv.URL)))
	if err != nil {
		t.Fatal(err)
	}
	o, err := New(cfg, Options{CPI: &vmCPI{vms: map[string]map[string]any{}}, Logger: logging.Discard(),
		NewForge: func(fc config.ForgeConfig) (Forge, error) {
			return Forge{Client: gitea.New(fc.URL, forge.NewTransport(func() string { return "token tok" }))}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go o.Run(ctx)
	eventually(t, 10*time.Second, "the forge's refusal in the status", func() bool {
		s, _ := statusOf(o, "a")
		return strings.Contains(s.LastError, marker)
	})
	s, _ := statusOf(o, "a")
	if strings.Contains(s.LastErrorBrief, marker) || !strings.Contains(s.LastErrorBrief, "HTTP 403") {
		t.Errorf("LastErrorBrief %q", s.LastErrorBrief)
	}
}
