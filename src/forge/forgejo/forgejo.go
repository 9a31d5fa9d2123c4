// Package forgejo is the orchestrator's Forgejo client, written from
// Forgejo's own API (routers/api/v1/shared/runners.go, modules/structs):
// Forgejo forked from Gitea and its runner API went its own way.
//
//   - Runners are registered by the REST API (POST <scope>/actions/runners,
//     with `ephemeral`): the answer is the runner's id, UUID and token, with
//     which it connects; no registration token changes hands.
//   - Jobs come from GET <scope>/actions/runners/jobs: one unpaginated
//     array of the waiting and running jobs, carrying a repository id but
//     no repository name, runner name or dates.
//   - A runner's status is offline, idle or active (busy); runners cannot
//     be disabled; an ephemeral runner takes one task and stays registered
//     afterwards until it is removed.
//   - No workflow_job webhook: Forgejo is polled.
package forgejo

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/runway-cpi/runway/src/forge"
)

// PageLimit is the page size asked of runner listings.
const PageLimit = 50

// Client talks to one Forgejo instance.
type Client struct {
	api forge.GiteaAPI

	mu    sync.Mutex
	repos map[int64]string // repository id → owner/name (ids never change)
}

// New returns a client for baseURL (the instance URL, without /api/v1)
// over t, which carries the token ("token <value>").
func New(baseURL string, t *forge.Transport) *Client {
	return &Client{api: forge.NewGiteaAPI(baseURL, t), repos: map[int64]string{}}
}

// apiJob is structs.ActionRunJob.
type apiJob struct {
	ID      int64    `json:"id"`
	RunID   int64    `json:"run_id"`
	RepoID  int64    `json:"repo_id"`
	OwnerID int64    `json:"owner_id"`
	Name    string   `json:"name"`
	RunsOn  []string `json:"runs_on"`
	TaskID  int64    `json:"task_id"`
	Status  string   `json:"status"` // waiting | running
}

// apiRunner is structs.ActionRunner.
type apiRunner struct {
	ID        int64    `json:"id"`
	UUID      string   `json:"uuid"`
	Name      string   `json:"name"`
	Labels    []string `json:"labels"`
	Status    string   `json:"status"` // offline | idle | active
	Ephemeral bool     `json:"ephemeral"`
}

// statuses maps Forgejo's job statuses to the orchestrator's: "waiting"
// is a job ready for a runner (Gitea's REST API calls it queued); a job
// blocked on needs is not listed at all.
var statuses = map[string]string{"waiting": forge.StatusQueued, "running": forge.StatusInProgress}

// Jobs implements forge.Client: the scope's waiting and running jobs, in
// one request (no labels asked: the groups match labels themselves).
func (c *Client) Jobs(ctx context.Context, s forge.Scope) ([]forge.Job, error) {
	prefix, err := s.APIPrefix()
	if err != nil {
		return nil, err
	}
	var list []apiJob
	if err := c.api.Do(ctx, "GET", prefix+"/actions/runners/jobs", nil, &list); err != nil {
		return nil, err
	}
	out := make([]forge.Job, 0, len(list))
	for _, aj := range list {
		status, ok := statuses[aj.Status]
		if !ok {
			continue
		}
		repo := ""
		if s.Kind == "repo" {
			repo = s.Owner + "/" + s.Repo
		} else if repo, err = c.repoName(ctx, aj.RepoID); err != nil {
			return nil, err
		}
		out = append(out, forge.Job{ID: aj.ID, RunID: aj.RunID, Repo: repo, Name: aj.Name, Labels: aj.RunsOn, Status: status})
	}
	return out, nil
}

// repoName is owner/name of a repository id (GET /repositories/{id}),
// asked once per id.
func (c *Client) repoName(ctx context.Context, id int64) (string, error) {
	c.mu.Lock()
	name, ok := c.repos[id]
	c.mu.Unlock()
	if ok {
		return name, nil
	}
	var repo struct {
		FullName string `json:"full_name"`
	}
	if err := c.api.Do(ctx, "GET", "/repositories/"+strconv.FormatInt(id, 10), nil, &repo); err != nil {
		return "", fmt.Errorf("forgejo: the repository of a job: %w", err)
	}
	if !strings.Contains(repo.FullName, "/") {
		return "", fmt.Errorf("forgejo: repository %d has no owner/name (%q)", id, repo.FullName)
	}
	c.mu.Lock()
	c.repos[id] = repo.FullName
	c.mu.Unlock()
	return repo.FullName, nil
}

// Job implements forge.Client. Forgejo serves no single job: the
// repository's listing is read again, and a job no longer in it (not
// waiting, not running) is done.
func (c *Client) Job(ctx context.Context, j forge.Job) (forge.Job, error) {
	owner, name, ok := strings.Cut(j.Repo, "/")
	if !ok {
		return forge.Job{}, fmt.Errorf("forgejo: job %d has no repository", j.ID)
	}
	jobs, err := c.Jobs(ctx, forge.Scope{Kind: "repo", Owner: owner, Repo: name})
	if err != nil {
		return forge.Job{}, err
	}
	for _, x := range jobs {
		if x.ID == j.ID {
			return x, nil
		}
	}
	return forge.Job{ID: j.ID, Repo: j.Repo, Status: forge.StatusCompleted}, nil
}

// Register implements forge.Client: an ephemeral runner made by the REST
// API. The runner declares its labels itself when it connects.
func (c *Client) Register(ctx context.Context, s forge.Scope, name string, _ []string) (forge.Registration, error) {
	prefix, err := s.APIPrefix()
	if err != nil {
		return forge.Registration{}, err
	}
	var out struct {
		ID    int64  `json:"id"`
		UUID  string `json:"uuid"`
		Token string `json:"token"`
	}
	in := map[string]any{"name": name, "description": "Runway ephemeral runner", "ephemeral": true}
	if err := c.api.Do(ctx, "POST", prefix+"/actions/runners", in, &out); err != nil {
		return forge.Registration{}, err
	}
	if out.ID == 0 || out.UUID == "" || out.Token == "" {
		return forge.Registration{}, fmt.Errorf("POST %s/actions/runners: the answer lacks the runner's id, uuid or token", prefix)
	}
	return forge.Registration{Token: out.Token, UUID: out.UUID, RunnerID: out.ID}, nil
}

// Runners implements forge.Client: every page. Online is idle or
// active; busy is active (a task reported within the last 10 s).
func (c *Client) Runners(ctx context.Context, s forge.Scope) ([]forge.Runner, error) {
	prefix, err := s.APIPrefix()
	if err != nil {
		return nil, err
	}
	var out []forge.Runner
	for page := 1; page <= 10000; page++ {
		q := url.Values{"page": {strconv.Itoa(page)}, "limit": {strconv.Itoa(PageLimit)}}
		var list []apiRunner
		if err := c.api.Do(ctx, "GET", prefix+"/actions/runners?"+q.Encode(), nil, &list); err != nil {
			return nil, err
		}
		for _, r := range list {
			status := "offline"
			if r.Status == "idle" || r.Status == "active" {
				status = "online"
			}
			out = append(out, forge.Runner{ID: r.ID, Name: r.Name, Status: status, Busy: r.Status == "active", Labels: r.Labels})
		}
		if len(list) < PageLimit {
			return out, nil
		}
	}
	return nil, errors.New("forgejo: runners listing does not end")
}

// DeleteRunner implements forge.Client.
func (c *Client) DeleteRunner(ctx context.Context, s forge.Scope, id int64) error {
	prefix, err := s.APIPrefix()
	if err != nil {
		return err
	}
	err = c.api.Do(ctx, "DELETE", prefix+"/actions/runners/"+strconv.FormatInt(id, 10), nil, nil)
	if errors.Is(err, forge.ErrNotFound) {
		return nil
	}
	return err
}

// DisableRunner implements forge.Client: Forgejo has no disabled runners.
func (c *Client) DisableRunner(context.Context, forge.Scope, int64) (bool, error) { return false, nil }

// VerifyDelivery implements forge.Client: Forgejo sends no workflow_job
// deliveries, so none is taken.
func (c *Client) VerifyDelivery(_, _ []byte, _ http.Header) bool { return false }

// Check implements forge.Checker: the read endpoints a group of scope s
// polls (registering a runner only to check would leave one behind).
func (c *Client) Check(ctx context.Context, s forge.Scope) error {
	prefix, err := s.APIPrefix()
	if err != nil {
		return err
	}
	var errs []error
	note := func(what string, err error) {
		var ae *forge.APIError
		switch {
		case err == nil:
		case errors.As(err, &ae) && (ae.Status == 401 || ae.Status == 403):
			errs = append(errs, fmt.Errorf("%s: Forgejo refuses the token (HTTP %d: %s)", what, ae.Status, ae.Message))
		default:
			errs = append(errs, fmt.Errorf("%s: %w", what, err))
		}
	}
	_, err = c.Jobs(ctx, s)
	note("list waiting jobs (GET "+prefix+"/actions/runners/jobs)", err)
	_, err = c.Runners(ctx, s)
	note("list runners (GET "+prefix+"/actions/runners)", err)
	return errors.Join(errs...)
}
