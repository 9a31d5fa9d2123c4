package gitea_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/gitea"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
	"github.com/runway-cpi/runway/src/testkit/forgetest/gitearunner"
)

func client(url, token string) (*gitea.Client, *forge.Transport) {
	tr := forge.NewTransport(func() string { return "token " + token })
	return gitea.New(url, tr), tr
}

func TestJobsEveryPageQueuedAndRunningOnly(t *testing.T) {
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	var want []int64
	for i := 0; i < 120; i++ {
		want = append(want, srv.AddJob("acme/app", "j", []string{"linux"}, forge.StatusQueued))
		srv.AddJob("acme/app", "blocked", []string{"linux"}, forge.StatusWaiting)
	}
	running := srv.AddJob("acme/lib", "r", []string{"linux"}, forge.StatusQueued)
	srv.SetJobStatus(running, forge.StatusInProgress)
	done := srv.AddJob("acme/lib", "d", []string{"linux"}, forge.StatusQueued)
	srv.SetJobStatus(done, forge.StatusCompleted)
	srv.AddJob("other/app", "x", []string{"linux"}, forge.StatusQueued)

	c, _ := client(srv.URL, "tok")
	jobs, err := c.Jobs(context.Background(), forge.Scope{Kind: "org", Owner: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 121 {
		t.Fatalf("got %d jobs, want 120 queued + 1 running", len(jobs))
	}
	for i, id := range want {
		if jobs[i].ID != id || jobs[i].Repo != "acme/app" || jobs[i].Status != forge.StatusQueued {
			t.Fatalf("job %d: %+v", i, jobs[i])
		}
	}
	if last := jobs[120]; last.ID != running || last.Status != forge.StatusInProgress || last.Repo != "acme/lib" {
		t.Fatalf("running job: %+v", last)
	}
	if n := srv.Requests()["GET /api/v1/orgs/acme/actions/jobs"]; n != 3 {
		t.Errorf("%d requests for 121 jobs at 50 a page", n)
	}
	j, err := c.Job(context.Background(), forge.Job{ID: done, Repo: "acme/lib"})
	if err != nil || j.Status != forge.StatusCompleted {
		t.Errorf("Job: %+v %v", j, err)
	}
	if _, err := c.Job(context.Background(), forge.Job{ID: 1, Repo: "acme/lib"}); !errors.Is(err, forge.ErrNotFound) {
		t.Errorf("missing job: %v", err)
	}
}

func TestRegistrationTokenReusedAndRunners(t *testing.T) {
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	c, _ := client(srv.URL, "tok")
	s := forge.Scope{Kind: "repo", Owner: "acme", Repo: "app"}
	a, err := c.Register(context.Background(), s, "r1", nil)
	if err != nil || len(a.Token) != 40 {
		t.Fatalf("token %q: %v", a.Token, err)
	}
	b, _ := c.Register(context.Background(), s, "r2", nil)
	if a != b || srv.Requests()["POST /api/v1/repos/acme/app/actions/runners/registration-token"] != 1 {
		t.Errorf("the scope's token is asked for once and reused")
	}
	rs, err := c.Runners(context.Background(), s)
	if err != nil || len(rs) != 0 {
		t.Fatalf("runners: %v %v", rs, err)
	}
	if err := c.DeleteRunner(context.Background(), s, 12345); err != nil {
		t.Errorf("deleting a missing runner: %v", err)
	}
}

func TestErrorsAreTyped(t *testing.T) {
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	c, _ := client(srv.URL, "wrong")
	_, err := c.Jobs(context.Background(), forge.Scope{Kind: "global"})
	var ae *forge.APIError
	if !errors.As(err, &ae) || ae.Status != 401 {
		t.Fatalf("bad token: %v", err)
	}
	if !strings.Contains(err.Error(), "HTTP 401") || strings.Contains(err.Error(), "wrong") {
		t.Errorf("error %q: want the status, never the token", err)
	}
	srv.SetDown(true)
	c, tr := client(srv.URL, "tok")
	tr.Retry.Budget = 300 * time.Millisecond
	_, err = c.Jobs(context.Background(), forge.Scope{Kind: "global"})
	if !errors.As(err, &ae) || ae.Status != 503 {
		t.Fatalf("forge down: %v", err)
	}
	if n := srv.Requests()["GET /api/v1/admin/actions/jobs"]; n < 2 {
		t.Errorf("a 503 was not retried (%d requests)", n)
	}
}

// Runners at every scope the SDK serves, registered through the runner
// protocol, and deleted.
func TestRunnersAtEachScope(t *testing.T) {
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	c, _ := client(srv.URL, "tok")
	for _, tc := range []struct {
		s     forge.Scope
		scope string
	}{
		{forge.Scope{Kind: "global"}, "/admin"},
		{forge.Scope{Kind: "org", Owner: "acme"}, "/orgs/acme"},
		{forge.Scope{Kind: "user"}, "/user"},
		{forge.Scope{Kind: "repo", Owner: "acme", Repo: "app"}, "/repos/acme/app"},
	} {
		reg, err := c.Register(context.Background(), tc.s, "r", nil)
		if err != nil || reg.Token != srv.RegistrationToken(tc.scope) {
			t.Fatalf("%v: token %q, %v", tc.s, reg.Token, err)
		}
		r, err := gitearunner.Register(srv.URL, reg.Token, "runner-"+tc.s.Kind, []string{"linux", "x64"}, true)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := c.Runners(context.Background(), tc.s)
		var mine *forge.Runner
		for i := range rs {
			if rs[i].Name == r.Name {
				mine = &rs[i]
			}
		}
		if err != nil || mine == nil || strings.Join(mine.Labels, ",") != "linux,x64" {
			t.Fatalf("%v: runners %+v, %v", tc.s, rs, err)
		}
		if err := c.DeleteRunner(context.Background(), tc.s, mine.ID); err != nil {
			t.Fatalf("%v: delete: %v", tc.s, err)
		}
		if err := c.DeleteRunner(context.Background(), tc.s, mine.ID); err != nil {
			t.Errorf("%v: deleting it again: %v", tc.s, err)
		}
	}
}

// A disabled runner fetches no task (Gitea 1.26's PATCH of a runner);
// disabling a missing runner is a not-found error.
func TestDisabledRunnerTakesNoJob(t *testing.T) {
	srv := forgetest.NewGitea("tok")
	defer srv.Close()
	c, _ := client(srv.URL, "tok")
	ctx := context.Background()
	s := forge.Scope{Kind: "repo", Owner: "acme", Repo: "app"}
	reg, err := c.Register(ctx, s, "r", nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := gitearunner.Register(srv.URL, reg.Token, "r", []string{"linux"}, true)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := c.Runners(ctx, s)
	if err != nil || len(rs) != 1 {
		t.Fatalf("runners %+v %v", rs, err)
	}
	if ok, err := c.DisableRunner(ctx, s, rs[0].ID); !ok || err != nil {
		t.Fatalf("disable: %v %v", ok, err)
	}
	srv.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	if id, err := r.FetchTask(); id != "" || err != nil {
		t.Errorf("a disabled runner fetched task %q (%v)", id, err)
	}
	if _, err := c.DisableRunner(ctx, s, 999999); !errors.Is(err, forge.ErrNotFound) {
		t.Errorf("disabling a missing runner: %v", err)
	}
}

// Deliveries verify with Gitea's signature header only.
func TestVerifyDelivery(t *testing.T) {
	c, _ := client("http://127.0.0.1:1", "tok")
	forgetest.CheckVerifyDelivery(t, c.VerifyDelivery,
		func(secret, body []byte) http.Header {
			return http.Header{"X-Gitea-Signature": {forge.Sign(secret, body)}}
		},
		func(secret, body []byte) map[string]http.Header {
			return map[string]http.Header{"not hex": {"X-Gitea-Signature": {"zz"}}}
		})
}
