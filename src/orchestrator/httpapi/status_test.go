package httpapi

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/orchestrator"
	"github.com/runway-cpi/runway/src/orchestrator/store"
)

// The status page renders groups, runners, the last hour's plot and
// recent errors on the server; what an error says is escaped, and a
// secret it carries is redacted.
func TestStatusPage(t *testing.T) {
	d := testDaemon(t, "")
	now := time.Now()
	d.now = func() time.Time { return now }
	if err := d.o.Store().Save(store.Runner{Name: "g-abc", Group: "g", AgentID: "g-abc", State: store.Busy, JobID: 42, JobRepo: "acme/app",
		VMCID: "vm-1", CreatedAt: now.Add(-90 * time.Second), StateAt: now}); err != nil {
		t.Fatal(err)
	}
	h := d.o.History()
	h.Record("g", now.Add(-2*time.Hour), 9, 9) // older than the plot's hour: dropped
	for i := 0; i < 5; i++ {
		h.Record("g", now.Add(time.Duration(i-5)*time.Minute), i, 1)
	}
	h.RecordDuration("g", orchestrator.JobQueue, now, 1500*time.Millisecond)
	const secret = "s3cret-forge-token-value"
	d.redact.Add(secret)
	d.o.Failure("g", "forge", errors.New(`GET /orgs/acme/actions/jobs: <script>alert(1)</script> token `+secret))
	addr := serve(t, d)
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	page := string(b)
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET / = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	for _, want := range []string{`data-group="g"`, `data-state="busy"`, "g-abc", "acme/app #42", "1m30s", `<polyline class="queued"`,
		"&lt;script&gt;alert(1)&lt;/script&gt;", `http-equiv="refresh"`,
		`<tr class="timing" data-kind="job queue"><td>job queue</td><td class="count">1</td><td>1.5s</td>`,
		`<tr class="timing" data-kind="runner start-up"><td>runner start-up</td><td class="count">0</td><td>-</td>`} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	for _, bad := range []string{"<script>", secret} {
		if strings.Contains(page, bad) {
			t.Errorf("the page contains %q", bad)
		}
	}
	if n := len(h.Samples("g")); n != 5 {
		t.Errorf("%d samples kept; want the 5 of the last hour", n)
	}
	if resp, err := http.Get("http://" + addr + "/nope"); err != nil || resp.StatusCode != 404 {
		t.Errorf("GET /nope: %v %v", resp.StatusCode, err)
	}
}
