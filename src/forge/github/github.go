// Package github is the orchestrator's GitHub client: queued runs and
// their jobs (the slow reconciliation poll — demand normally arrives by
// `workflow_job` webhook), JIT runner configs with a registration-token
// fallback, and the runners list.
package github

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/runway-cpi/runway/src/forge"
)

const perPage = 100

// Client talks to api.github.com or a GHES /api/v3 base.
type Client struct {
	API *forge.API
	// RunnerGroupID is sent with JIT requests (1 is "Default").
	RunnerGroupID int64
}

// New returns a client; apiURL is e.g. https://api.github.com.
func New(apiURL, token string) *Client {
	a := forge.NewAPI(apiURL, "Bearer "+token)
	a.Headers = map[string]string{"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
	return &Client{API: a, RunnerGroupID: 1}
}

func scopeBase(s forge.Scope) (string, error) {
	switch s.Kind {
	case "org":
		return "/orgs/" + url.PathEscape(s.Owner), nil
	case "repo":
		return "/repos/" + url.PathEscape(s.Owner) + "/" + url.PathEscape(s.Repo), nil
	}
	return "", fmt.Errorf("github: scope %q is not supported (use org or repo)", s.Kind)
}

type apiJob = forge.JobJSON

// Jobs implements forge.Client: the queued and in-progress jobs of the
// queued and in-progress runs of every repository in scope.
func (c *Client) Jobs(ctx context.Context, s forge.Scope) ([]forge.Job, error) {
	repos := []string{s.Owner + "/" + s.Repo}
	if s.Kind == "org" {
		var err error
		if repos, err = c.orgRepos(ctx, s.Owner); err != nil {
			return nil, err
		}
	} else if s.Kind != "repo" {
		return nil, fmt.Errorf("github: scope %q is not supported (use org or repo)", s.Kind)
	}
	var out []forge.Job
	for _, repo := range repos {
		for _, status := range []string{forge.StatusQueued, forge.StatusInProgress} {
			runs, err := c.runs(ctx, repo, status)
			if err != nil {
				return nil, err
			}
			for _, run := range runs {
				jobs, err := c.runJobs(ctx, repo, run)
				if err != nil {
					return nil, err
				}
				for _, j := range jobs {
					if j.Status == forge.StatusQueued || j.Status == forge.StatusInProgress {
						out = append(out, j.Job(repo))
					}
				}
			}
		}
	}
	return out, nil
}

func (c *Client) orgRepos(ctx context.Context, org string) ([]string, error) {
	var out []string
	for page := 1; page < 1000; page++ {
		var body []struct {
			FullName string `json:"full_name"`
			Archived bool   `json:"archived"`
		}
		q := url.Values{"per_page": {strconv.Itoa(perPage)}, "page": {strconv.Itoa(page)}}
		h, err := c.API.Do(ctx, "GET", "/orgs/"+url.PathEscape(org)+"/repos", q, nil, &body)
		if err != nil {
			return nil, err
		}
		for _, r := range body {
			if !r.Archived {
				out = append(out, r.FullName)
			}
		}
		if forge.NextPage(h) == 0 {
			break
		}
	}
	return out, nil
}

func (c *Client) runs(ctx context.Context, repo, status string) ([]int64, error) {
	var out []int64
	for page := 1; page < 1000; page++ {
		var body struct {
			Runs []struct {
				ID int64 `json:"id"`
			} `json:"workflow_runs"`
		}
		q := url.Values{"status": {status}, "per_page": {strconv.Itoa(perPage)}, "page": {strconv.Itoa(page)}}
		h, err := c.API.Do(ctx, "GET", "/repos/"+repo+"/actions/runs", q, nil, &body)
		if err != nil {
			return nil, err
		}
		for _, r := range body.Runs {
			out = append(out, r.ID)
		}
		if forge.NextPage(h) == 0 {
			break
		}
	}
	return out, nil
}

func (c *Client) runJobs(ctx context.Context, repo string, run int64) ([]apiJob, error) {
	var out []apiJob
	for page := 1; page < 1000; page++ {
		var body struct {
			Jobs []apiJob `json:"jobs"`
		}
		q := url.Values{"filter": {"latest"}, "per_page": {strconv.Itoa(perPage)}, "page": {strconv.Itoa(page)}}
		h, err := c.API.Do(ctx, "GET", fmt.Sprintf("/repos/%s/actions/runs/%d/jobs", repo, run), q, nil, &body)
		if err != nil {
			return nil, err
		}
		out = append(out, body.Jobs...)
		if forge.NextPage(h) == 0 {
			break
		}
	}
	return out, nil
}

// Job implements forge.Client.
func (c *Client) Job(ctx context.Context, j forge.Job) (forge.Job, error) {
	if !strings.Contains(j.Repo, "/") {
		return forge.Job{}, fmt.Errorf("github: job %d has no repository", j.ID)
	}
	var aj apiJob
	if _, err := c.API.Do(ctx, "GET", fmt.Sprintf("/repos/%s/actions/jobs/%d", j.Repo, j.ID), nil, nil, &aj); err != nil {
		return forge.Job{}, err
	}
	return aj.Job(j.Repo), nil
}

// Register implements forge.Client: a JIT config bound to this runner,
// or — where JIT is refused — a registration token.
func (c *Client) Register(ctx context.Context, s forge.Scope, name string, labels []string) (forge.Registration, error) {
	base, err := scopeBase(s)
	if err != nil {
		return forge.Registration{}, err
	}
	var jit struct {
		Runner struct {
			ID int64 `json:"id"`
		} `json:"runner"`
		Encoded string `json:"encoded_jit_config"`
	}
	req := map[string]any{"name": name, "runner_group_id": c.RunnerGroupID, "labels": forge.LabelNames(labels), "work_folder": "_work"}
	_, err = c.API.Do(ctx, "POST", base+"/actions/runners/generate-jitconfig", nil, req, &jit)
	if err == nil && jit.Encoded != "" {
		return forge.Registration{JITConfig: jit.Encoded, RunnerID: jit.Runner.ID}, nil
	}
	var ae *forge.APIError
	if err != nil && !(errors.As(err, &ae) && (ae.Status == 403 || ae.Status == 404 || ae.Status == 422)) {
		return forge.Registration{}, err
	}
	token, err := c.API.RegistrationToken(ctx, base)
	if err != nil {
		return forge.Registration{}, err
	}
	return forge.Registration{Token: token}, nil
}

// paging: per_page, ended by the Link header's lack of a next page.
var paging = forge.Paging{
	Query: func(page int) url.Values {
		return url.Values{"per_page": {strconv.Itoa(perPage)}, "page": {strconv.Itoa(page)}}
	},
	Last: func(h http.Header, _, _, _ int) bool { return forge.NextPage(h) == 0 },
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
