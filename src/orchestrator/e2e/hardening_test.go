package e2e

import (
	"bytes"
	"fmt"
	"image/color"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// runway.db deleted under a running daemon: health turns unhealthy and the
// daemon stops acting; restarted on a fresh store, it leaves the old
// store's VMs (live runners) alone instead of deleting them as strays.
func TestLostStoreStopsTheDaemonAndSparesItsVMs(t *testing.T) {
	e := newEnv(t)
	e.writeConfig("1s", e.group("keep", "scope: org\n    org: acme", []string{"linux"}, 3, ""))
	e.start()
	e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	e.eventually(20*time.Second, "a runner VM", func() bool { return len(e.vms()) == 1 })
	old := e.vms()[0]

	db := filepath.Join(e.dir, "orch", "runway.db")
	for _, f := range []string{db, db + "-wal", db + "-shm"} {
		os.Remove(f)
	}
	e.eventually(10*time.Second, "/healthz answers 503", func() bool {
		resp, err := http.Get("http://" + e.addr + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusServiceUnavailable
	})
	// It stops acting: a new queued job gets no runner.
	e.gitea.AddJob("acme/app", "build-2", []string{"linux"}, forge.StatusQueued)
	e.eventually(10*time.Second, "a failed pass naming the store", func() bool {
		return strings.Contains(e.groupStatus("keep").LastError, "runway.db")
	})
	if n := len(e.vms()); n != 1 {
		t.Fatalf("the daemon acted on a lost store: %d VMs", n)
	}

	e.stop(false)
	e.start() // a new, empty runway.db
	e.eventually(20*time.Second, "the foreign VM is reported", func() bool {
		return strings.Contains(e.metrics(), `runway_foreign_vms{group="keep"} 1`)
	})
	still := false
	for _, v := range e.vms() {
		still = still || v.CID == old.CID
	}
	if !still {
		t.Fatalf("the old store's VM %s was deleted by the new store's sweep", old.CID)
	}
}

// A delivery the forge sends again (same delivery id) is answered but not
// acted on twice.
func TestRedeliveredWebhookIsActedOnOnce(t *testing.T) {
	e := newEnv(t)
	e.writeConfig("1h", e.group("hooked", "scope: org\n    org: acme", []string{"linux"}, 3, ""))
	e.start()
	body := []byte(`{"action":"queued","workflow_job":{"id":4242,"labels":["linux"],"status":"queued"},"repository":{"full_name":"acme/app"}}`)
	send := func() int {
		req, _ := http.NewRequest("POST", "http://"+e.addr+"/webhooks/gitea", bytes.NewReader(body))
		req.Header.Set("X-Gitea-Event", "workflow_job")
		req.Header.Set("X-Gitea-Delivery", "d-4242")
		req.Header.Set("X-Gitea-Signature", forge.Sign([]byte(webhookSecret), body))
		resp, err := http.DefaultClient.Do(req)
		must(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	if c1, c2 := send(), send(); c1 != http.StatusAccepted || c2 != http.StatusAccepted {
		t.Fatalf("deliveries answered %d and %d", c1, c2)
	}
	m := e.metrics()
	if !strings.Contains(m, `runway_webhook_deliveries_total{result="accepted",type="gitea"} 1`) ||
		!strings.Contains(m, `runway_webhook_deliveries_total{result="duplicate",type="gitea"} 1`) {
		t.Fatalf("metrics:\n%s", grep(m, "runway_webhook"))
	}
}

func grep(text, sub string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// A runner whose process exits before it ever registers is reaped by the
// sweep (list_vms shows its VM stopped) — and its VM is deleted once: the
// stray-VM check works from the VM list taken before the reap, and used to
// delete it a second time ("a VM no runner accounts for", VMNotFound).
func TestReapedRunnerIsNotAlsoAStray(t *testing.T) {
	e := newEnv(t)
	e.writeConfig("200ms", fmt.Sprintf(`
  - name: crash
    scope: org
    org: acme
    labels: ["linux"]
    max_active_runners: 1
    min_idle: 1
    stemcell: {image: %q}
    cloud_properties: {}
    runner:
      command: /bin/false
    timeouts: {spawn: 2m, idle: 2m, max_lifetime: 10m}
`, bins.stemcell))
	e.start()
	e.eventually(60*time.Second, "two crashed runners reaped by the sweep", func() bool {
		return strings.Count(e.stderr.String(), "runner process exited") >= 2
	})
	if line := grep(e.stderr.String(), "deleting a VM no runner accounts for"); line != "" {
		t.Errorf("a reaped runner's VM was deleted again as a stray: %s", line)
	}
	if m := grep(e.metrics(), `runway_cpi_call_errors_total{method="delete_vm"`); m != "" {
		t.Errorf("delete_vm failed: %s", m)
	}
}

// A wrong token is fixed without a restart: the daemon reads the token
// file again when it changes, and the queued job then gets its runner.
func TestTokenFileIsReadAgainWhenItChanges(t *testing.T) {
	e := newEnv(t)
	tokenFile := filepath.Join(e.dir, "api-token")
	must(t, os.WriteFile(tokenFile, []byte("a-wrong-token\n"), 0o600))
	e.writeConfig("200ms", e.group("linux", "scope: org\n    org: acme", []string{"linux"}, 1, ""))
	job := e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	e.start()
	e.eventually(30*time.Second, "the forge refusing the wrong token", func() bool {
		return strings.Contains(e.groupStatus("linux").LastError, "401")
	})
	if n := len(e.runners(true)); n != 0 {
		t.Fatalf("%d runners made with a token the forge refuses", n)
	}
	must(t, os.WriteFile(tokenFile, []byte(apiToken+"\n"), 0o600))
	e.eventually(60*time.Second, "the job runs with the fixed token", completed(e, job))
	if !strings.Contains(e.stderr.String(), "secret file changed: using the new value") {
		t.Errorf("the reload was not logged")
	}
}

// The token scope the docs name must be enough, and a missing one is
// named: with write:organization alone, checking a finished job is
// refused by Gitea (read:repository); runway check and the daemon's
// start-up say so, and pass with both scopes.
func TestCheckNamesTheMissingTokenScope(t *testing.T) {
	e := newEnv(t)
	e.gitea.TokenScopes = []string{"write:organization"}
	e.writeConfig("200ms", e.group("linux", "scope: org\n    org: acme", []string{"linux"}, 1, ""))
	out, err := e.runway("check", "-config", e.cfgPath)
	if err == nil || !strings.Contains(out, "check a finished job") || !strings.Contains(out, "the token lacks the scope read:repository") ||
		strings.Contains(out, "list runners") {
		t.Fatalf("runway check with write:organization only: %v\n%s", err, out)
	}
	if strings.Contains(out, apiToken) {
		t.Fatalf("runway check printed the token:\n%s", out)
	}
	e.start()
	e.eventually(10*time.Second, "the daemon names the missing scope at start-up", func() bool {
		return strings.Contains(e.stderr.String(), "the forge refuses what this group needs") &&
			strings.Contains(e.stderr.String(), "read:repository")
	})
	e.stop(false)
	e.gitea.TokenScopes = []string{"write:organization", "read:repository"}
	if out, err := e.runway("check", "-config", e.cfgPath); err != nil || !strings.HasPrefix(out, "ok: 1 groups") {
		t.Fatalf("runway check with the documented scopes: %v\n%s", err, out)
	}
}

// The status page in a real headless Chromium: the rendered DOM has the
// group, the busy runner with its job, the plot, and no secret; the
// screenshot is a drawn page.
func TestStatusPageInChromium(t *testing.T) {
	chromium := testenv.Need(t, "apt-get install chromium; scripts/test exports it", "RUNWAY_CHROMIUM")[0]
	e := newEnv(t)
	e.holdJobs()
	e.writeConfig("200ms", e.group("linux", "scope: org\n    org: acme", []string{"linux"}, 2, ""))
	job := e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	e.start()
	e.eventually(30*time.Second, "a runner runs the job", func() bool {
		rs := e.runners(false)
		return len(rs) == 1 && rs[0].State == store.Busy && rs[0].JobID == job
	})
	shot := filepath.Join(e.dir, "status.png")
	browse := func(args ...string) string {
		t.Helper()
		args = append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
			"--user-data-dir=" + filepath.Join(e.dir, "chromium"), "--window-size=1200,900"}, args...)
		cmd := exec.Command(chromium, append(args, "http://"+e.addr+"/")...)
		cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + e.dir}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("chromium %v: %v\n%s", args, err, stderr.String())
		}
		return string(out)
	}
	dom := browse("--dump-dom")
	for _, want := range []string{`data-group="linux"`, `data-state="busy"`, fmt.Sprintf("acme/app #%d", job), `class="queued"`, `class="runners"`} {
		if !strings.Contains(dom, want) {
			t.Errorf("the rendered page lacks %q:\n%s", want, dom)
		}
	}
	for _, secret := range []string{apiToken, webhookSecret} {
		if strings.Contains(dom, secret) {
			t.Errorf("the page shows a secret")
		}
	}
	browse("--screenshot=" + shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	img, err := png.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	colors := map[color.Color]bool{}
	b := img.Bounds()
	for y := b.Min.Y; y < b.Max.Y; y += 7 {
		for x := b.Min.X; x < b.Max.X; x += 7 {
			colors[img.At(x, y)] = true
		}
	}
	if b.Dx() != 1200 || b.Dy() != 900 || len(colors) < 8 {
		t.Errorf("screenshot %v with %d colours: not a drawn page", b, len(colors))
	}
	e.releaseJobs()
	e.eventually(60*time.Second, "the job completes", completed(e, job))
}
