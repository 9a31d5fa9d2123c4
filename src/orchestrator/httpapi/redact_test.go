package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/orchestrator"
	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// noCanary fails t when text carries any of forgetest.CanaryURLAt's
// secrets.
func noCanary(t *testing.T, what, text string) {
	t.Helper()
	if strings.Contains(text, "canary") {
		t.Errorf("%s carries a canary secret:\n%s", what, text)
	}
}

// A forge URL's user info and query values reach no answer of the HTTP
// interface: the group's last_error from a failing pass (the issue's
// case), a runner row holding one unredacted (written by an older
// daemon), the status page, /metrics and /healthz. The path segment
// stays, so the error still says where.
func TestURLSecretsRedactedInEveryAnswer(t *testing.T) {
	d := testDaemonAt(t, forgetest.CanaryURL(t), "") // the forge is down: every pass fails naming its URL
	raw := `create_vm: Post "` + forgetest.CanaryURLAt("nova.example") + `": 500`
	if err := d.o.Store().Save(store.Runner{Name: "g-abc", Group: "g", AgentID: "g-abc", State: store.Busy, LastError: raw,
		CreatedAt: time.Now(), StateAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	d.o.Failure("g", "cpi", errors.New(raw))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { d.o.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitFor(t, 10*time.Second, "a pass failing at the forge", func() bool { return status(d.o, "g").LastError != "" })
	addr := serve(t, d)

	var groups []orchestrator.GroupStatus
	body := get(t, addr, "/api/v1/groups", &groups)
	noCanary(t, "/api/v1/groups", body)
	if len(groups) != 1 || !strings.Contains(groups[0].LastError, "/keep-this-segment?token=<redacted>") {
		t.Errorf("/api/v1/groups last_error %+v: the forge URL's path is lost", groups)
	}
	for _, p := range []string{"/api/v1/runners", "/api/v1/runners?all=true"} {
		var runners []RunnerView
		body := get(t, addr, p, &runners)
		noCanary(t, p, body)
		if len(runners) != 1 || !strings.Contains(runners[0].LastError, "nova.example/keep-this-segment?token=<redacted>") {
			t.Errorf("%s: %+v", p, runners)
		}
	}
	page := get(t, addr, "/", nil)
	noCanary(t, "the status page", page)
	if !strings.Contains(page, "/keep-this-segment?token=&lt;redacted&gt;") {
		t.Errorf("the status page lost the path of the URLs it redacted:\n%s", page)
	}
	noCanary(t, "/metrics", get(t, addr, "/metrics", nil))
	noCanary(t, "/healthz", get(t, addr, "/healthz", nil))
}

// get GETs path and answers the body; into (when not nil) is decoded
// from it, which must be JSON.
func get(t *testing.T, addr, path string, into any) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if into != nil {
		if err := json.Unmarshal(b, into); err != nil {
			t.Errorf("%s is not JSON any more: %v\n%s", path, err, b)
		}
	}
	return string(b)
}
