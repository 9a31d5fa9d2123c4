package scaleset

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

const apiToken = "ghp-scaleset-test-token"

var org = forge.Scope{Kind: "org", Owner: "acme"}

// newClient is a client of the contract server for scope, and the REST
// and Actions requests it made (by status).
func newClient(t *testing.T, g *forgetest.GitHub, scope forge.Scope) *Client {
	t.Helper()
	rest := forge.NewTransport(func() string { return "Bearer " + apiToken })
	c, err := New(Config{APIURL: g.URL, ConfigURL: ConfigURL(g.URL, scope), Scope: scope, REST: rest, Actions: forge.NewTransport(nil)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// newServer is a contract server speaking github.com's flow (the
// service as it is today); newGHES one speaking GHES 3.19's.
func newServer(t *testing.T) *forgetest.GitHub {
	g := forgetest.NewGitHub(apiToken)
	t.Cleanup(g.Close)
	return g
}

func newGHES(t *testing.T) *forgetest.GitHub {
	g := newServer(t)
	g.SetActionsFlow(forgetest.FlowGHES)
	return g
}

// linuxSession makes a scale set named name taking "linux" jobs and
// opens a message session on it for owner.
func linuxSession(t *testing.T, ctx context.Context, c *Client, name, owner string) (ScaleSet, *Session) {
	t.Helper()
	set, err := c.Ensure(ctx, Spec{Name: name, RunnerGroupID: 1, Labels: []string{"linux"}})
	if err != nil {
		t.Fatal(err)
	}
	sess, err := c.OpenSession(ctx, set.ID, owner)
	if err != nil {
		t.Fatal(err)
	}
	return set, sess
}

// orgSession is a client for org on g, the test's context, and a scale
// set named name with a session opened for owner (linuxSession).
func orgSession(t *testing.T, g *forgetest.GitHub, name, owner string) (context.Context, *Client, ScaleSet, *Session) {
	t.Helper()
	c := newClient(t, g, org)
	ctx := ctxT(t)
	set, sess := linuxSession(t, ctx, c, name, owner)
	return ctx, c, set, sess
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// runner plays a scale set runner with its JIT config: it calls in,
// takes a job, and (done) completes it.
type runner struct {
	URL    string `json:"url"`
	ID     int64  `json:"runner_id"`
	Secret string `json:"secret"`
}

func runnerOf(t *testing.T, jit JIT) runner {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(jit.Encoded)
	if err != nil {
		t.Fatal(err)
	}
	var r runner
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r runner) call(t *testing.T, what string) int64 {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"runner_id": r.ID, "secret": r.Secret})
	resp, err := http.Post(r.URL+"/_runner/"+what, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		JobID int64 `json:"job_id"`
	}
	json.NewDecoder(resp.Body).Decode(&got)
	return got.JobID
}

// The admin connection is made once and kept while its token lasts; the
// scale set is found by runner group and name (made the first time, its
// labels set again when they differ — its name, which the service always
// adds, is no difference: no PATCH at every session's open).
func TestScaleSetFoundOrMadeWithOneAdminConnection(t *testing.T) {
	g := newServer(t)
	c := newClient(t, g, org)
	ctx := ctxT(t)
	spec := Spec{Name: "runway-linux", RunnerGroupID: 1, Labels: []string{"linux", "x64"}}
	a, err := c.Ensure(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		b, err := c.Ensure(ctx, spec)
		if err != nil || b.ID != a.ID || len(b.Missing) != 0 {
			t.Fatalf("Ensure again: %+v, %v; want scale set %d again", b, err, a.ID)
		}
	}
	if n := g.ActionsStats().LabelPatches; n != 0 {
		t.Fatalf("%d label PATCHes for unchanged labels; want none (the set's name among its labels is the service's)", n)
	}
	spec.Labels = []string{"linux"}
	if _, err := c.Ensure(ctx, spec); err != nil {
		t.Fatal(err)
	}
	sets := g.ScaleSets()
	if len(sets) != 1 || strings.Join(sets[0].Labels, ",") != "runway-linux,linux" || g.ActionsStats().LabelPatches != 1 {
		t.Fatalf("scale sets %+v; want one, labelled runway-linux (its name) and linux, after one PATCH", sets)
	}
	req := g.Requests()
	if n := req["POST /orgs/acme/actions/runners/registration-token"]; n != 1 {
		t.Errorf("%d registration tokens asked for; want 1 (the admin token lasts an hour)", n)
	}
	if n := req["POST /actions/runner-registration"]; n != 1 {
		t.Errorf("%d admin connections; want 1", n)
	}
	if !c.AdminExpiry().After(time.Now().Add(50 * time.Minute)) {
		t.Errorf("admin token expires at %s; want in about an hour", c.AdminExpiry())
	}
}

// An admin token that expires is renewed before use: a minute ahead.
func TestAdminTokenRenewedBeforeItExpires(t *testing.T) {
	g := newServer(t)
	g.SetActionsTimes(30*time.Second, 0, 0) // inside the minute: every use renews
	c := newClient(t, g, forge.Scope{Kind: "repo", Owner: "acme", Repo: "app"})
	ctx := ctxT(t)
	for range 3 {
		if _, err := c.Ensure(ctx, Spec{Name: "s", RunnerGroupID: 1, Labels: []string{"s"}}); err != nil {
			t.Fatal(err)
		}
	}
	// Find and make, then find twice: every request renews.
	if n := g.Requests()["POST /actions/runner-registration"]; n != 4 {
		t.Errorf("%d admin connections; want 4 (each use inside the last minute renews)", n)
	}
}

// One session per scale set: a second listener is refused with the
// conflict, until the first session is deleted.
func TestOneSessionPerScaleSet(t *testing.T) {
	g := newServer(t)
	ctx, c, set, first := orgSession(t, g, "s", "replica-a")
	_, err := c.OpenSession(ctx, set.ID, "replica-b")
	var e *Error
	if !errors.Is(err, ErrSessionConflict) || !errors.As(err, &e) || e.Status != 409 || e.Exception != "RunnerScaleSetSessionConflictException" {
		t.Fatalf("second session: %v; want the 409 session conflict", err)
	}
	if err := c.DeleteSession(ctx, set.ID, first.ID()); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteSession(ctx, set.ID, first.ID()); err != nil {
		t.Errorf("deleting a deleted session: %v; want nothing (it is gone)", err)
	}
	if _, err := c.OpenSession(ctx, set.ID, "replica-b"); err != nil {
		t.Fatalf("after the delete: %v", err)
	}
}

// GHES: the long poll returns as a job arrives; the job is acquired
// once: a second scale set offered the same job gets nothing.
func TestLongPollReturnsWhenAJobArrivesAndAJobIsAcquiredOnce(t *testing.T) {
	g := newGHES(t)
	g.SetActionsTimes(0, 0, 20*time.Second)
	ctx, c, _, sa := orgSession(t, g, "a", "x")
	_, sb := linuxSession(t, ctx, c, "b", "x")
	got := make(chan *Message, 1)
	go func() {
		m, err := sa.Message(ctx, 0, 10)
		if err != nil {
			t.Error(err)
		}
		got <- m
	}()
	start := time.Now()
	g.AddJob("acme/app", []string{"linux"})
	m := <-got
	if took := time.Since(start); took > 5*time.Second || m == nil {
		t.Fatalf("the poll answered %v after %s; want the job at once", m, took)
	}
	if len(m.Available) != 1 || m.Available[0].RequestID == 0 || m.Available[0].Repo() != "acme/app" {
		t.Fatalf("message %+v; want one JobAvailable for acme/app", m)
	}
	req := m.Available[0].RequestID
	mb, err := sb.Message(ctx, 0, 10)
	if err != nil || mb == nil || len(mb.Available) != 1 {
		t.Fatalf("scale set b: %+v, %v; want the same job offered", mb, err)
	}
	ids, err := sa.Acquire(ctx, []int64{req})
	if err != nil || len(ids) != 1 {
		t.Fatalf("acquire: %v, %v", ids, err)
	}
	if ids, err := sb.Acquire(ctx, []int64{req}); err != nil || len(ids) != 0 {
		t.Fatalf("second scale set's acquire: %v, %v; want nothing (acquired once)", ids, err)
	}
	if err := sa.DeleteMessage(ctx, m.ID); err != nil {
		t.Fatal(err)
	}
	next, err := sa.Message(ctx, m.ID, 10)
	if err != nil || next == nil || len(next.Assigned) != 1 || next.Statistics.TotalAssignedJobs != 1 {
		t.Fatalf("after acquiring: %+v, %v; want JobAssigned and one assigned job", next, err)
	}
}

// GHES: a runner made from the scale set's JIT config takes the set's
// job: JobStarted and JobCompleted name it; the runner is gone
// afterwards.
func TestJITRunnerRunsTheAcquiredJob(t *testing.T) {
	g := newGHES(t)
	ctx, c, set, sess := orgSession(t, g, "s", "x")
	job := g.AddJob("acme/app", []string{"linux"})
	m, _ := sess.Message(ctx, 0, 1)
	if _, err := sess.Acquire(ctx, []int64{m.Available[0].RequestID}); err != nil {
		t.Fatal(err)
	}
	sess.DeleteMessage(ctx, m.ID)
	jit, err := c.GenerateJIT(ctx, set.ID, "s-runner-1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := c.GenerateJIT(ctx, set.ID, "s-runner-1")
	if err != nil || again.Runner.ID == jit.Runner.ID {
		t.Fatalf("the same name again: %+v, %v; want the old registration replaced", again.Runner, err)
	}
	r := runnerOf(t, again)
	if got := r.call(t, "acquire"); got != job {
		t.Fatalf("the runner took job %d; want %d", got, job)
	}
	if err := c.RemoveRunner(ctx, again.Runner.ID); !errors.Is(err, ErrJobStillRunning) {
		t.Errorf("removing a runner running a job: %v; want ErrJobStillRunning", err)
	}
	r.call(t, "complete")
	var kinds []string
	for last := m.ID; len(kinds) < 3; {
		next, err := sess.Message(ctx, last, 1)
		if err != nil || next == nil {
			t.Fatalf("message after %d: %v, %v", last, next, err)
		}
		for _, l := range [][]JobMessage{next.Assigned, next.Started, next.Completed} {
			for _, j := range l {
				kinds = append(kinds, j.Kind+":"+j.RunnerName)
			}
		}
		last = next.ID
		sess.DeleteMessage(ctx, next.ID)
	}
	if want := "JobAssigned:,JobStarted:s-runner-1,JobCompleted:s-runner-1"; strings.Join(kinds, ",") != want {
		t.Errorf("events %v; want %s", kinds, want)
	}
	if err := c.RemoveRunner(ctx, again.Runner.ID); err != nil {
		t.Errorf("removing a runner already gone: %v; want nothing", err)
	}
}

// A message queue token that expires (mid-poll, say) is refreshed once
// and the request made again.
func TestExpiredSessionTokenIsRefreshed(t *testing.T) {
	g := newServer(t)
	g.SetActionsTimes(0, 0, 200*time.Millisecond)
	ctx, _, _, sess := orgSession(t, g, "s", "x")
	g.ExpireSessionTokens()
	if m, err := sess.Message(ctx, 0, 1); err != nil || m != nil {
		t.Fatalf("poll with an expired token: %v, %v; want a refresh then 202", m, err)
	}
	if st := g.ActionsStats(); st.Refreshes != 1 || st.Expired401 != 1 {
		t.Errorf("stats %+v; want one 401 and one refresh", st)
	}
}

// Errors name what failed, never a token; URLs in them are redacted.
func TestErrorsCarryNoSecret(t *testing.T) {
	g := newServer(t)
	ctx, c, set, sess := orgSession(t, g, "s", "x")
	_, err := c.OpenSession(ctx, set.ID, "y")
	g.DeleteScaleSet(set.ID)
	_, err2 := sess.Message(ctx, 0, 1)
	_, err3 := c.GenerateJIT(ctx, set.ID, "r")
	for _, e := range []error{err, err2, err3} {
		if e == nil {
			t.Fatal("want errors")
		}
		for _, secret := range []string{apiToken, sess.token, c.adminToken, "RemoteAuth"} {
			if strings.Contains(e.Error(), secret) {
				t.Errorf("error %q holds a secret", e)
			}
		}
	}
	if !errors.Is(err2, forge.ErrNotFound) || !errors.Is(err3, forge.ErrNotFound) {
		t.Errorf("a deleted scale set: %v / %v; want not found", err2, err3)
	}
}
