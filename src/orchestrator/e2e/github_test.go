package e2e

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// gitHubForge is an environment whose one forge, "gh", is a GitHub
// contract server polled every poll, with a webhook secret; the server
// closes after the daemon has stopped.
func gitHubForge(t testing.TB, poll string) (*env, *forgetest.GitHub) {
	gh := forgetest.NewGitHub(apiToken)
	t.Cleanup(gh.Close)
	e := newEnv(t)
	e.forgeYML = fmt.Sprintf(`
  - name: gh
    type: github
    url: %s
    runner_url: %s
    token_env: RUNWAY_TEST_GH_TOKEN
    webhook_secret_file: %s
    poll_interval: %s`, gh.URL, gh.URL, filepath.Join(e.dir, "hook-secret"), poll)
	e.extraEnv = []string{"RUNWAY_TEST_GH_TOKEN=" + apiToken}
	return e, gh
}

// gitHubEnv is an env whose one forge is a GitHub contract server polled
// every poll, and whose group "gha" (acme/app, self-hosted + linux) may
// run maxActive runners; not started.
func gitHubEnv(t *testing.T, poll string, maxActive int) (*env, *forgetest.GitHub) {
	e, gh := gitHubForge(t, poll)
	e.writeConfig("", e.group("gha", "scope: repo\n    repo: acme/app", []string{"self-hosted", "linux"}, maxActive, ""))
	return e, gh
}

// GitHub: demand arrives by webhook (the poll is an hour apart), each
// runner gets its own JIT config, and the completed delivery retires it.
func TestGitHubWebhookJIT(t *testing.T) {
	e, gh := gitHubEnv(t, "1h", 3)
	e.start()
	e.eventually(10*time.Second, "the first (polling) pass", func() bool { return !e.groupStatus("gha").LastCheckTime.IsZero() })
	gh.AddHook("http://"+e.addr+"/webhooks/github", []byte(webhookSecret))
	a := gh.AddJob("acme/app", []string{"self-hosted", "linux"})
	b := gh.AddJob("acme/app", []string{"linux"})
	skip := gh.AddJob("acme/app", []string{"macos"})
	e.eventually(60*time.Second, "both jobs complete", func() bool {
		return gh.Job(a).Status == "completed" && gh.Job(b).Status == "completed"
	})
	e.eventually(30*time.Second, "the runners are retired", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	if n := len(e.runners(true)); n != 2 {
		t.Errorf("want 2 runners, got %d", n)
	}
	if gh.Job(skip).Status != "queued" || gh.RunnerCount() != 0 {
		t.Errorf("macos job %s, %d runners registered", gh.Job(skip).Status, gh.RunnerCount())
	}
	req := gh.Requests()
	if req["POST /repos/acme/app/actions/runners/generate-jitconfig"] != 2 || req["POST /repos/acme/app/actions/runners/registration-token"] != 0 {
		t.Errorf("want one JIT config per runner and no registration token: %v", req)
	}
	// One listing (queued and in-progress runs: 2 requests) for the first
	// pass and one for the start-up access check; webhooks do the rest.
	if polls := req["GET /repos/acme/app/actions/runs"]; polls > 4 {
		t.Errorf("the queue was polled %d times with an hour's poll interval", polls)
	}
}

// GitHub's rate limit as a budget: listings polled every 200 ms are
// conditional (unchanged ones answered 304, free); when another client of
// the token has left less than a fifth of the budget, listings wait for
// the reset while webhooks carry the demand and runners are still made
// and removed. No request is refused and no job lost.
func TestGitHubStaysInsideItsRateLimit(t *testing.T) {
	e, gh := gitHubEnv(t, "200ms", 4)
	const limit = 150
	gh.SetRateLimit(limit, time.Hour)
	e.start()
	e.eventually(10*time.Second, "the first (polling) pass", func() bool { return !e.groupStatus("gha").LastCheckTime.IsZero() })
	gh.AddHook("http://"+e.addr+"/webhooks/github", []byte(webhookSecret))
	done := func(jobs []int64) func() bool {
		return func() bool { return gh.Completed(jobs...) }
	}
	var jobs []int64
	for range 10 {
		jobs = append(jobs, gh.AddJob("acme/app", []string{"self-hosted", "linux"}))
	}
	e.eventually(60*time.Second, "ten jobs complete", done(jobs))
	// Polls of an unchanged queue cost nothing.
	_, _, before := gh.RateUsage()
	e.eventually(10*time.Second, "unchanged listings answered 304", func() bool { _, _, n := gh.RateUsage(); return n >= before+5 })

	// Another client of the token leaves 25 of 150.
	for {
		req, _ := http.NewRequest("GET", gh.URL+"/repos/acme/app/actions/runners", nil)
		req.Header.Set("Authorization", "Bearer "+apiToken)
		resp, err := http.DefaultClient.Do(req)
		must(t, err)
		resp.Body.Close()
		if n, _ := strconv.Atoi(resp.Header.Get("X-RateLimit-Remaining")); n <= 25 {
			break
		}
	}
	e.eventually(10*time.Second, "the daemon sees the budget low", func() bool {
		return strings.Contains(e.stderr.String(), "forge rate limit low")
	})
	polls := gh.Requests()["GET /repos/acme/app/actions/runs"]
	more := []int64{gh.AddJob("acme/app", []string{"self-hosted", "linux"}), gh.AddJob("acme/app", []string{"linux"})}
	e.eventually(60*time.Second, "the jobs queued while the budget is low complete", done(more))
	e.eventually(30*time.Second, "the runners are retired", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	used, refused, notModified := gh.RateUsage()
	t.Logf("%d requests of %d used, %d answered 304, %d refused", used, limit, notModified, refused)
	if refused != 0 {
		t.Errorf("%d requests refused for the rate limit", refused)
	}
	if n := gh.Requests()["GET /repos/acme/app/actions/runs"] - polls; n != 0 {
		t.Errorf("%d listings while the budget was low", n)
	}
	if m := e.metrics(); !strings.Contains(m, `runway_forge_requests_total{code="304",forge="gh",method="GET"}`) {
		t.Errorf("304s are not counted:\n%s", grep(m, "runway_forge_requests_total"))
	}
}

// The budget through a 1,000-job run: GitHub's documented 5,000 requests
// an hour, 3,400 of it already spent by another client of the token, and
// 1,000 jobs queued at once by webhook (over one keep-alive client, all
// at once), the poll GitHub's default 5 minutes. Each job runs once, on a
// runner of its own; about one request per job; no request is refused,
// no delivery lost; nothing is left. (Listings waiting while the budget
// is low: TestGitHubStaysInsideItsRateLimit.)
func TestGitHubThousandJobsInsideItsRateLimit(t *testing.T) {
	const n, limit, spentElsewhere = 1000, 5000, 3400
	e, gh := gitHubEnv(t, "5m", n)
	e.sweep = "5s"
	e.writeConfig("", e.group("gha", "scope: repo\n    repo: acme/app", []string{"self-hosted", "linux"}, n, "    spawn_concurrency: 16\n"))
	gh.SetRateLimit(limit, time.Hour)
	e.start()
	e.eventually(10*time.Second, "the first (polling) pass", func() bool { return !e.groupStatus("gha").LastCheckTime.IsZero() })
	gh.AddHook("http://"+e.addr+"/webhooks/github", []byte(webhookSecret))
	for range spentElsewhere {
		req, _ := http.NewRequest("GET", gh.URL+"/repos/acme/app/actions/runners?per_page=1&n="+strconv.Itoa(time.Now().Nanosecond()), nil)
		req.Header.Set("Authorization", "Bearer "+apiToken)
		resp, err := http.DefaultClient.Do(req)
		must(t, err)
		resp.Body.Close()
	}
	start := time.Now()
	jobs := make([]int64, n)
	for i := range jobs {
		jobs[i] = gh.AddJob("acme/app", []string{"self-hosted", "linux"})
	}
	e.eventually(10*time.Minute, "every job completes", func() bool { return gh.Completed(jobs...) })
	took := time.Since(start)
	e.eventually(2*time.Minute, "the runners are retired", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	used, refused, notModified := gh.RateUsage()
	t.Logf("%d jobs done in %v; %d requests of %d used (%d by the other client), %d answered 304, %d refused",
		n, took.Round(time.Second), used, limit, spentElsewhere, notModified, refused)
	if refused != 0 {
		t.Errorf("%d requests refused for the rate limit", refused)
	}
	if f := gh.FailedDeliveries(); len(f) != 0 {
		t.Errorf("%d webhook deliveries failed, e.g. %s; connections the cap cut off:\n%s", len(f), f[0],
			grep(e.metrics(), "runway_http_connections_cut_total"))
	}
	// One JIT config per runner and a few listings: no request spent
	// removing a registration GitHub removed itself after the job.
	if ours := used - spentElsewhere; ours > n*11/10 {
		t.Errorf("Runway used %d requests for %d jobs", ours, n)
	}
	ranBy := map[string]int64{}
	for _, id := range jobs {
		j := gh.Job(id)
		if j.Conclusion != "success" {
			t.Errorf("job %d ended %q", id, j.Conclusion)
		}
		if prev, dup := ranBy[j.RunnerName]; dup {
			t.Errorf("runner %s ran jobs %d and %d", j.RunnerName, prev, id)
		}
		ranBy[j.RunnerName] = id
	}
	if made := len(e.runners(true)); made != n {
		t.Errorf("%d runners made for %d jobs", made, n)
	}
	if c := gh.RunnerCount(); c != 0 {
		t.Errorf("%d runner registrations left", c)
	}
}
