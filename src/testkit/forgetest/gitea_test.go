package forgetest

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"testing"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/testkit/forgetest/gitearunner"
)

const testToken = "api-token"

func register(t *testing.T, g *Gitea, scope string, labels []string, ephemeral bool) *gitearunner.Runner {
	t.Helper()
	r, err := gitearunner.Register(g.URL, g.RegistrationToken(scope), "r", labels, ephemeral)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func fetch(t *testing.T, r *gitearunner.Runner) string {
	t.Helper()
	id, err := r.FetchTask()
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func id(n int64) string { return strconv.FormatInt(n, 10) }

// Gitea stores a runner's labels as sent and matches runs-on exactly: a
// runner that registered "linux:host" never takes a "linux" job.
func TestGiteaLabelsMatchAsRegistered(t *testing.T) {
	g := NewGitea(testToken)
	defer g.Close()
	job := g.AddJob("acme/app", "build", []string{"linux"}, "queued")
	schemed := register(t, g, "/orgs/acme", []string{"linux:host"}, true)
	if got := fetch(t, schemed); got != "" {
		t.Fatalf("a runner registered as linux:host took task %s for runs-on linux", got)
	}
	named := register(t, g, "/orgs/acme", forge.LabelNames([]string{"linux:host"}), true)
	if got := fetch(t, named); got != id(job) {
		t.Fatalf("a runner registered with label names got %q, want task %s", got, id(job))
	}
	for _, rn := range g.Runners() {
		if rn.UUID == schemed.UUID && (len(rn.Labels) != 1 || rn.Labels[0] != "linux:host") {
			t.Errorf("labels stored as %q, want them as sent", rn.Labels)
		}
	}
}

// FetchTask picks only when the runner's known tasks version of its own
// scope is another, and then the waiting job updated first.
func TestGiteaTasksVersionAndOrder(t *testing.T) {
	g := NewGitea(testToken)
	defer g.Close()
	r := register(t, g, "/orgs/acme", []string{"linux"}, false)
	if got := fetch(t, r); got != "" || r.TasksVersion != "1" {
		t.Fatalf("empty queue: task %q, version %q; want none, 1 (a missing counter starts at 1)", got, r.TasksVersion)
	}
	g.AddJob("elsewhere/app", "build", []string{"linux"}, "queued")
	if fetch(t, r); r.TasksVersion != "1" {
		t.Fatalf("another owner's job moved acme's version to %s", r.TasksVersion)
	}
	older := g.AddJob("acme/app", "a", []string{"linux"}, "waiting")
	newer := g.AddJob("acme/app", "b", []string{"linux"}, "queued")
	g.SetJobStatus(older, "queued") // updated after newer
	r.TasksVersion = "3"            // acme's latest: one bump per job queued
	if got := fetch(t, r); got != "" {
		t.Fatalf("a runner at the latest version got task %s", got)
	}
	r.TasksVersion = "1"
	if got := fetch(t, r); got != id(newer) {
		t.Fatalf("picked %q, want the job updated first (%s)", got, id(newer))
	}
	if r.TasksVersion != "0" {
		t.Errorf("after a task the runner sends %q, want 0 (gitea-runner asks again)", r.TasksVersion)
	}
	if got := fetch(t, r); got != id(older) {
		t.Fatalf("a non-ephemeral runner with a task picked %q next, want %s", got, id(older))
	}
}

// An ephemeral runner takes one task, lists as busy while it reports
// progress, is deleted when the task is done and refused afterwards.
func TestGiteaEphemeralRunnerDeletedWhenDone(t *testing.T) {
	g := NewGitea(testToken)
	defer g.Close()
	first := g.AddJob("acme/app", "build", []string{"linux"}, "queued")
	second := g.AddJob("acme/app", "test", []string{"linux"}, "queued")
	r := register(t, g, "/repos/acme/app", []string{"linux"}, true)
	if got := fetch(t, r); got != id(first) {
		t.Fatalf("got %q", got)
	}
	if got := fetch(t, r); got != "" {
		t.Fatalf("an ephemeral runner with a task took another: %s", got)
	}
	if err := r.Update(id(first), ""); err != nil {
		t.Fatal(err)
	}
	var listed struct {
		Runners []struct {
			Busy   bool `json:"busy"`
			Labels []struct {
				ID int64 `json:"id"`
			} `json:"labels"`
		} `json:"runners"`
	}
	req, _ := http.NewRequest("GET", g.URL+"/api/v1/repos/acme/app/actions/runners", nil)
	req.Header.Set("Authorization", "token "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	json.NewDecoder(resp.Body).Decode(&listed)
	resp.Body.Close()
	if len(listed.Runners) != 1 || !listed.Runners[0].Busy || listed.Runners[0].Labels[0].ID != 0 {
		t.Fatalf("listing while working: %+v; want one busy runner, label ids from 0", listed.Runners)
	}
	if err := r.Update(id(first), "RESULT_SUCCESS"); err != nil {
		t.Fatal(err)
	}
	if j := g.Job(first); j.Status != "completed" || j.Conclusion != "success" {
		t.Fatalf("job after UpdateTask: %+v", j)
	}
	if n := len(g.Runners()); n != 0 {
		t.Fatalf("%d runners after the ephemeral runner's task was done", n)
	}
	var se *gitearunner.StatusError
	if _, err := r.FetchTask(); !errors.As(err, &se) || se.Code != http.StatusUnauthorized {
		t.Fatalf("FetchTask by a deleted runner: %v, want HTTP 401", err)
	}
	if s := g.Job(second).Status; s != "queued" {
		t.Errorf("the second job is %s", s)
	}
}
