package github_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/github"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

func client(t *testing.T, url, token string) (*github.Client, *forge.Transport) {
	t.Helper()
	tr := forge.NewTransport(func() string { return "Bearer " + token })
	c, err := github.New(url, tr)
	if err != nil {
		t.Fatal(err)
	}
	return c, tr
}

var ctx = context.Background()

// Queued and in-progress jobs of queued and in-progress runs, every page
// of every listing (runs, a run's jobs, an organisation's repositories),
// archived repositories left out.
func TestJobsEveryPage(t *testing.T) {
	srv := forgetest.NewGitHub("tok")
	defer srv.Close()
	var want []int64
	big := int64(900001)
	for i := 0; i < 150; i++ { // one run, two pages of jobs
		want = append(want, srv.AddJobInRun("acme/app", big, []string{"linux"}))
	}
	for i := 0; i < 110; i++ { // 110 runs: two pages of runs
		want = append(want, srv.AddJob("acme/lib", []string{"linux", "x64"}))
	}
	running := srv.AddJob("acme/lib", []string{"linux"})
	srv.SetJobStatus(running, forge.StatusInProgress)
	want = append(want, running)
	done := srv.AddJob("acme/lib", []string{"linux"})
	srv.SetJobStatus(done, forge.StatusCompleted)
	srv.AddJob("acme/old", []string{"linux"})
	srv.Archived["acme/old"] = true
	srv.AddJob("other/app", []string{"linux"})

	c, _ := client(t, srv.URL, "tok")
	jobs, err := c.Jobs(ctx, forge.Scope{Kind: "org", Owner: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, j := range jobs {
		got = append(got, j.ID)
		if !strings.HasPrefix(j.Repo, "acme/") || len(j.Labels) == 0 || (j.Status != forge.StatusQueued && j.Status != forge.StatusInProgress) {
			t.Errorf("job %+v", j)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("got %d jobs, want %d (the queued and running ones of acme's live repositories)", len(got), len(want))
	}
	req := srv.Requests()
	if n := req["GET /repos/acme/lib/actions/runs"]; n != 3 {
		t.Errorf("%d runs requests for acme/lib (2 pages of queued runs, 1 of in-progress)", n)
	}
	if n := req["GET /repos/acme/app/actions/runs/900001/jobs"]; n != 2 {
		t.Errorf("%d requests for a run of 150 jobs", n)
	}
	j, err := c.Job(ctx, forge.Job{ID: done, Repo: "acme/lib"})
	if err != nil || j.Status != forge.StatusCompleted || j.Conclusion != "success" {
		t.Errorf("Job: %+v %v", j, err)
	}
	if _, err := c.Job(ctx, forge.Job{ID: 1, Repo: "acme/lib"}); !errors.Is(err, forge.ErrNotFound) {
		t.Errorf("missing job: %v", err)
	}
	if _, err := c.Jobs(ctx, forge.Scope{Kind: "user", Owner: "bob"}); err == nil {
		t.Error("a user scope was accepted (GitHub has org and repo runners)")
	}
}

// A JIT config names the runner and its label names; where JIT is refused
// a registration token is the fallback. Runners list and delete, a
// missing one included.
func TestRegisterAndRunners(t *testing.T) {
	srv := forgetest.NewGitHub("tok")
	defer srv.Close()
	c, _ := client(t, srv.URL, "tok")
	s := forge.Scope{Kind: "repo", Owner: "acme", Repo: "app"}
	reg, err := c.Register(ctx, s, "g-1", []string{"self-hosted", "linux:host"})
	if err != nil || reg.JITConfig == "" || reg.RunnerID == 0 || reg.Token != "" {
		t.Fatalf("JIT: %+v %v", reg, err)
	}
	var cfg map[string]any
	b, _ := base64.StdEncoding.DecodeString(reg.JITConfig)
	if json.Unmarshal(b, &cfg) != nil || cfg["runner_id"] != float64(reg.RunnerID) {
		t.Errorf("JIT config %s", b)
	}
	rs, err := c.Runners(ctx, s)
	if err != nil || len(rs) != 1 || rs[0].Name != "g-1" || strings.Join(rs[0].Labels, ",") != "self-hosted,linux" {
		t.Fatalf("runners %+v %v", rs, err)
	}
	if err := c.DeleteRunner(ctx, s, rs[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteRunner(ctx, s, rs[0].ID); err != nil {
		t.Errorf("deleting a missing runner: %v", err)
	}
	srv.JITDisabled = true
	reg, err = c.Register(ctx, forge.Scope{Kind: "org", Owner: "acme"}, "g-2", []string{"linux"})
	if err != nil || reg.Token == "" || reg.JITConfig != "" {
		t.Fatalf("fallback: %+v %v", reg, err)
	}
}

// Errors carry the status, never the token; 5xx are retried within the
// budget.
func TestErrors(t *testing.T) {
	srv := forgetest.NewGitHub("tok")
	defer srv.Close()
	c, tr := client(t, srv.URL, "wrong-token")
	tr.Retry.Budget = 300 * time.Millisecond
	_, err := c.Runners(ctx, forge.Scope{Kind: "org", Owner: "acme"})
	var ae *forge.APIError
	if !errors.As(err, &ae) || ae.Status != 401 || !strings.Contains(err.Error(), "Bad credentials") {
		t.Fatalf("bad token: %v", err)
	}
	if strings.Contains(err.Error(), "wrong-token") {
		t.Errorf("the token reached the error: %v", err)
	}
}

// Deliveries verify with X-Hub-Signature-256 only.
func TestVerifyDelivery(t *testing.T) {
	c, _ := client(t, "http://127.0.0.1:1", "tok")
	forgetest.CheckVerifyDelivery(t, c.VerifyDelivery,
		func(secret, body []byte) http.Header {
			return http.Header{"X-Hub-Signature-256": {"sha256=" + forge.Sign(secret, body)}}
		},
		func(secret, body []byte) map[string]http.Header {
			return map[string]http.Header{
				"gitea header": {"X-Gitea-Signature": {forge.Sign(secret, body)}},
				"not hex":      {"X-Hub-Signature-256": {"sha256=zz"}},
			}
		})
}

// GitHub refuses to remove a runner running a job (422) and lists a JIT
// runner offline until it connects; Runway has no disable call there.
func TestBusyRunnerIsNotRemoved(t *testing.T) {
	srv := forgetest.NewGitHub("tok")
	defer srv.Close()
	c, _ := client(t, srv.URL, "tok")
	s := forge.Scope{Kind: "repo", Owner: "acme", Repo: "app"}
	reg, err := c.Register(ctx, s, "g-1", []string{"linux"})
	if err != nil {
		t.Fatal(err)
	}
	if rs, _ := c.Runners(ctx, s); len(rs) != 1 || rs[0].Status != "offline" {
		t.Fatalf("a JIT runner that never connected: %+v", rs)
	}
	if ok, err := c.DisableRunner(ctx, s, reg.RunnerID); ok || err != nil {
		t.Errorf("DisableRunner on GitHub: %v %v", ok, err)
	}
	srv.AddJob("acme/app", []string{"linux"})
	var cfg map[string]any
	b, _ := base64.StdEncoding.DecodeString(reg.JITConfig)
	json.Unmarshal(b, &cfg)
	who, _ := json.Marshal(map[string]any{"runner_id": cfg["runner_id"], "secret": cfg["secret"]})
	resp, err := http.Post(srv.URL+"/_runner/acquire", "application/json", strings.NewReader(string(who)))
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("acquire: %v %v", resp, err)
	}
	resp.Body.Close()
	rs, _ := c.Runners(ctx, s)
	if len(rs) != 1 || rs[0].Status != "online" || !rs[0].Busy {
		t.Fatalf("runner with a job: %+v", rs)
	}
	err = c.DeleteRunner(ctx, s, reg.RunnerID)
	var ae *forge.APIError
	if !errors.As(err, &ae) || ae.Status != 422 || !strings.Contains(err.Error(), "is still running a job") {
		t.Fatalf("removing a busy runner: %v", err)
	}
}

// Listings polled again unchanged are conditional requests answered 304,
// which cost none of the rate limit; the answers still list the jobs.
// Past the limit, GitHub's 403 reaches the caller as a typed error, and
// the budget is known from the headers.
func TestConditionalListingsAndTheRateLimit(t *testing.T) {
	srv := forgetest.NewGitHub("tok")
	defer srv.Close()
	srv.SetRateLimit(50, time.Hour)
	c, tr := client(t, srv.URL, "tok")
	var budget forge.RateBudget
	codes := map[int]int{}
	tr.Observe = func(_ string, status int, h http.Header) { codes[status]++; budget.Observe(h) }
	s := forge.Scope{Kind: "repo", Owner: "acme", Repo: "app"}
	srv.AddJob("acme/app", []string{"linux"})
	first, err := c.Jobs(ctx, s)
	if err != nil || len(first) != 1 {
		t.Fatalf("first listing: %v %v", first, err)
	}
	used, _, _ := srv.RateUsage()
	for range 5 {
		again, err := c.Jobs(ctx, s)
		if err != nil || len(again) != 1 || again[0].ID != first[0].ID {
			t.Fatalf("listing again: %v %v", again, err)
		}
	}
	if u, refused, notMod := srv.RateUsage(); u != used || refused != 0 || notMod == 0 {
		t.Errorf("five unchanged listings used %d more requests (%d answered 304)", u-used, notMod)
	}
	if codes[304] == 0 {
		t.Errorf("the observer saw no 304: %v", codes)
	}
	if low, _ := budget.Low(0.2, time.Now()); low {
		t.Error("the budget is low after a few requests of 50")
	}
	srv.SetRateLimit(1, time.Hour)
	c.Runners(ctx, s) // the one request of the window
	_, err = c.Runners(ctx, s)
	var ae *forge.APIError
	if !errors.As(err, &ae) || ae.Status != 403 || !strings.Contains(err.Error(), "rate limit") {
		t.Fatalf("past the limit: %v", err)
	}
	if low, reset := budget.Low(0.2, time.Now()); !low || reset.Before(time.Now()) {
		t.Errorf("past the limit the budget is not low (reset %v)", reset)
	}
}
