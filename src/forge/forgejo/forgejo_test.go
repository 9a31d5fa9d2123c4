package forgejo_test

import (
	"context"
	"errors"
	"strconv"
	"testing"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/forgejo"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
	"github.com/runway-cpi/runway/src/testkit/forgetest/gitearunner"
)

// newServer is a Forgejo contract server (closed at the test's end) and
// a client of it with its API token.
func newServer(t *testing.T) (*forgetest.Gitea, *forgejo.Client) {
	srv := forgetest.NewForgejo("tok")
	t.Cleanup(srv.Close)
	return srv, client(srv.URL, "tok")
}

func client(url, token string) *forgejo.Client {
	return forgejo.New(url, forge.NewTransport(func() string { return "token " + token }))
}

func TestJobsWaitingAndRunningWithTheirRepository(t *testing.T) {
	srv, c := newServer(t)
	ctx := context.Background()
	var queued []int64
	for i := 0; i < 120; i++ {
		queued = append(queued, srv.AddJob("acme/app", "j", []string{"linux"}, forge.StatusQueued))
	}
	srv.AddJob("acme/app", "blocked", []string{"linux"}, forge.StatusWaiting)
	running := srv.AddJob("acme/lib", "r", []string{"linux", "big"}, forge.StatusQueued)
	srv.SetJobStatus(running, forge.StatusInProgress)
	done := srv.AddJob("acme/lib", "d", []string{"linux"}, forge.StatusQueued)
	srv.SetJobStatus(done, forge.StatusCompleted)
	srv.AddJob("other/app", "x", []string{"linux"}, forge.StatusQueued)

	jobs, err := c.Jobs(ctx, forge.Scope{Kind: "org", Owner: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if len(jobs) != 121 {
		t.Fatalf("got %d jobs, want 120 waiting + 1 running (blocked, done and other owners' left out)", len(jobs))
	}
	for i, id := range queued {
		if j := jobs[i]; j.ID != id || j.Repo != "acme/app" || j.Status != forge.StatusQueued || len(j.Labels) != 1 {
			t.Fatalf("job %d: %+v", i, j)
		}
	}
	if j := jobs[120]; j.ID != running || j.Repo != "acme/lib" || j.Status != forge.StatusInProgress || len(j.Labels) != 2 {
		t.Fatalf("running job: %+v", j)
	}
	req := srv.Requests()
	if n := req["GET /api/v1/orgs/acme/actions/runners/jobs"]; n != 1 {
		t.Errorf("%d listings for 121 jobs: Forgejo's is one unpaginated answer", n)
	}
	if n := req["GET /api/v1/repositories/"+strconv.FormatInt(srv.RepoID("acme/app"), 10)]; n != 1 {
		t.Errorf("repository name asked %d times, want once", n)
	}
	if _, err := c.Jobs(ctx, forge.Scope{Kind: "org", Owner: "acme"}); err != nil {
		t.Fatal(err)
	}
	if n := srv.Requests()["GET /api/v1/repositories/"+strconv.FormatInt(srv.RepoID("acme/app"), 10)]; n != 1 {
		t.Errorf("repository name asked again (%d): ids do not change", n)
	}

	// An empty listing is JSON null at Forgejo.
	if jobs, err := c.Jobs(ctx, forge.Scope{Kind: "repo", Owner: "none", Repo: "x"}); err != nil || len(jobs) != 0 {
		t.Errorf("empty scope: %v %v", jobs, err)
	}
	// A job no longer listed is done; a listed one is as listed.
	if j, err := c.Job(ctx, forge.Job{ID: done, Repo: "acme/lib"}); err != nil || j.Status != forge.StatusCompleted {
		t.Errorf("finished job: %+v %v", j, err)
	}
	if j, err := c.Job(ctx, forge.Job{ID: running, Repo: "acme/lib"}); err != nil || j.Status != forge.StatusInProgress {
		t.Errorf("running job: %+v %v", j, err)
	}
}

func TestEphemeralRunnerRegisteredByRESTTakesOneJobAndStays(t *testing.T) {
	srv, c := newServer(t)
	ctx := context.Background()
	scope := forge.Scope{Kind: "repo", Owner: "acme", Repo: "app"}
	first := srv.AddJob("acme/app", "one", []string{"linux"}, forge.StatusQueued)
	second := srv.AddJob("acme/app", "two", []string{"linux"}, forge.StatusQueued)

	reg, err := c.Register(ctx, scope, "rw-1", []string{"linux"})
	if err != nil {
		t.Fatal(err)
	}
	if reg.UUID == "" || reg.Token == "" || reg.RunnerID == 0 {
		t.Fatalf("registration: %+v", reg)
	}
	runners, err := c.Runners(ctx, scope)
	if err != nil || len(runners) != 1 || runners[0].Status != "offline" || runners[0].ID != reg.RunnerID {
		t.Fatalf("before it connects: %+v %v", runners, err)
	}
	if rs := srv.Runners(); !rs[0].Ephemeral {
		t.Fatal("registered without ephemeral")
	}

	r, err := gitearunner.Connect(srv.URL, reg.UUID, reg.Token, "rw-1", []string{"linux"})
	if err != nil {
		t.Fatal(err)
	}
	task, err := r.FetchTask()
	if err != nil || task != strconv.FormatInt(first, 10) {
		t.Fatalf("first task %q %v", task, err)
	}
	if err := r.Update(task, ""); err != nil {
		t.Fatal(err)
	}
	runners, _ = c.Runners(ctx, scope)
	if !runners[0].Busy || runners[0].Status != "online" {
		t.Errorf("running a task: %+v", runners[0])
	}
	if err := r.Update(task, "RESULT_SUCCESS"); err != nil {
		t.Fatal(err)
	}
	r.TasksVersion = "0"
	if next, err := r.FetchTask(); err != nil || next != "" {
		t.Errorf("an ephemeral runner took a second task %q (%v)", next, err)
	}
	if j := srv.Job(second); j.Status != forge.StatusQueued {
		t.Errorf("second job %s", j.Status)
	}
	// Forgejo keeps it registered: removing it is Runway's part.
	if runners, _ = c.Runners(ctx, scope); len(runners) != 1 {
		t.Fatalf("after its task: %+v", runners)
	}
	if err := c.DeleteRunner(ctx, scope, reg.RunnerID); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteRunner(ctx, scope, reg.RunnerID); err != nil {
		t.Errorf("removing it again: %v", err)
	}
	if _, err := r.FetchTask(); err == nil {
		t.Error("a removed runner still fetches")
	}
	if ok, err := c.DisableRunner(ctx, scope, reg.RunnerID); ok || err != nil {
		t.Errorf("Forgejo cannot disable: %v %v", ok, err)
	}
}

func TestRunnersEveryPageAndTokenRefused(t *testing.T) {
	srv, c := newServer(t)
	ctx := context.Background()
	scope := forge.Scope{Kind: "org", Owner: "acme"}
	for i := 0; i < 120; i++ {
		if _, err := c.Register(ctx, scope, "rw-"+strconv.Itoa(i), nil); err != nil {
			t.Fatal(err)
		}
	}
	runners, err := c.Runners(ctx, scope)
	if err != nil || len(runners) != 120 {
		t.Fatalf("%d runners, %v", len(runners), err)
	}
	if err := c.Check(ctx, scope); err != nil {
		t.Errorf("check: %v", err)
	}
	bad := client(srv.URL, "wrong")
	var ae *forge.APIError
	if _, err := bad.Runners(ctx, scope); !errors.As(err, &ae) || ae.Status != 401 {
		t.Errorf("wrong token: %v", err)
	}
	if err := bad.Check(ctx, scope); err == nil {
		t.Error("check passed with a wrong token")
	}
}
