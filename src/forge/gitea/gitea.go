// Package gitea is the orchestrator's Gitea client: the actions jobs queue,
// the scope's runner registration token, and the runners list, as Gitea
// 1.26's API serves them (/api/swagger on any Gitea).
package gitea

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runway-cpi/runway/src/forge"
)

// PageLimit is Gitea's cap on `limit`.
const PageLimit = 50

// Client talks to one Gitea instance.
type Client struct {
	API *forge.API

	mu     sync.Mutex
	tokens map[string]cachedToken
}

type cachedToken struct {
	token string
	at    time.Time
}

// tokenTTL bounds how long a registration token is reused from memory.
// Gitea hands out the same long-lived token anyway; re-asking now and
// then picks up a rotation.
const tokenTTL = 10 * time.Minute

// New returns a client for baseURL (the instance URL, without /api/v1).
func New(baseURL, token string) *Client {
	return &Client{API: forge.NewAPI(strings.TrimRight(baseURL, "/")+"/api/v1", "token "+token), tokens: map[string]cachedToken{}}
}

// scopeBase is the API prefix that owns a scope's actions resources.
func scopeBase(s forge.Scope) (string, error) {
	switch s.Kind {
	case "global":
		return "/admin", nil
	case "org":
		return "/orgs/" + url.PathEscape(s.Owner), nil
	case "user":
		// Gitea serves a user's actions only to that user: the forge
		// token must be theirs.
		return "/user", nil
	case "repo":
		return "/repos/" + url.PathEscape(s.Owner) + "/" + url.PathEscape(s.Repo), nil
	}
	return "", fmt.Errorf("unknown scope %q", s.Kind)
}

type apiJob = forge.JobJSON

func job(j apiJob) forge.Job { return j.Job(RepoFromURL(j.URL)) }

// RepoFromURL takes owner/name from a job's API URL
// (.../api/v1/repos/{owner}/{repo}/actions/jobs/{id}).
func RepoFromURL(u string) string {
	_, rest, ok := strings.Cut(u, "/repos/")
	if !ok {
		return ""
	}
	parts := strings.SplitN(rest, "/", 3)
	if len(parts) < 2 {
		return ""
	}
	return parts[0] + "/" + parts[1]
}

// Jobs implements forge.Client: queued and in_progress jobs, every page.
func (c *Client) Jobs(ctx context.Context, s forge.Scope) ([]forge.Job, error) {
	base, err := scopeBase(s)
	if err != nil {
		return nil, err
	}
	var out []forge.Job
	for page := 1; ; page++ {
		q := url.Values{"status": {forge.StatusQueued, forge.StatusInProgress},
			"page": {strconv.Itoa(page)}, "limit": {strconv.Itoa(PageLimit)}}
		var body struct {
			Jobs       []apiJob `json:"jobs"`
			TotalCount int      `json:"total_count"`
		}
		h, err := c.API.Do(ctx, "GET", base+"/actions/jobs", q, nil, &body)
		if err != nil {
			return nil, err
		}
		for _, j := range body.Jobs {
			out = append(out, job(j))
		}
		if len(body.Jobs) < PageLimit || (forge.NextPage(h) == 0 && h.Get("Link") != "") || len(out) >= body.TotalCount {
			return out, nil
		}
		if page > 10000 {
			return nil, errors.New("gitea: jobs listing does not end")
		}
	}
}

// Job implements forge.Client.
func (c *Client) Job(ctx context.Context, j forge.Job) (forge.Job, error) {
	owner, name, ok := strings.Cut(j.Repo, "/")
	if !ok {
		return forge.Job{}, fmt.Errorf("gitea: job %d has no repository", j.ID)
	}
	var aj apiJob
	path := fmt.Sprintf("/repos/%s/%s/actions/jobs/%d", url.PathEscape(owner), url.PathEscape(name), j.ID)
	if _, err := c.API.Do(ctx, "GET", path, nil, nil, &aj); err != nil {
		return forge.Job{}, err
	}
	return job(aj), nil
}

// Register implements forge.Client: Gitea has one reusable token per scope.
func (c *Client) Register(ctx context.Context, s forge.Scope, _ string, _ []string) (forge.Registration, error) {
	base, err := scopeBase(s)
	if err != nil {
		return forge.Registration{}, err
	}
	c.mu.Lock()
	t, ok := c.tokens[base]
	c.mu.Unlock()
	if ok && time.Since(t.at) < tokenTTL {
		return forge.Registration{Token: t.token}, nil
	}
	token, err := c.API.RegistrationToken(ctx, base)
	if err != nil {
		return forge.Registration{}, err
	}
	c.mu.Lock()
	c.tokens[base] = cachedToken{token: token, at: time.Now()}
	c.mu.Unlock()
	return forge.Registration{Token: token}, nil
}

// paging: page and limit, ended by a short page or total_count.
var paging = forge.Paging{
	Query: func(page int) url.Values {
		return url.Values{"page": {strconv.Itoa(page)}, "limit": {strconv.Itoa(PageLimit)}}
	},
	Last: func(_ http.Header, total, got, onPage int) bool { return onPage < PageLimit || got >= total },
}

// Runners implements forge.Client.
func (c *Client) Runners(ctx context.Context, s forge.Scope) ([]forge.Runner, error) {
	base, err := scopeBase(s)
	if err != nil {
		return nil, err
	}
	return c.API.ListRunners(ctx, base, paging)
}

// DeleteRunner implements forge.Client.
func (c *Client) DeleteRunner(ctx context.Context, s forge.Scope, id int64) error {
	base, err := scopeBase(s)
	if err != nil {
		return err
	}
	return c.API.DeleteRunner(ctx, base, id)
}
