// Package github is the orchestrator's GitHub client on go-github:
// queued runs and their jobs (the slow reconciliation poll — demand
// normally arrives by `workflow_job` webhook), JIT runner configs with a
// registration-token fallback, the runners list, and webhook signatures.
package github

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	gh "github.com/google/go-github/v75/github"

	"github.com/runway-cpi/runway/src/forge"
)

const perPage = 100

// Client talks to api.github.com or a GHES /api/v3 base.
type Client struct {
	gh *gh.Client
	// RunnerGroupID is sent with JIT requests (1 is "Default").
	RunnerGroupID int64
}

// New returns a client for apiURL (e.g. https://api.github.com) over t,
// which carries the token ("Bearer <value>").
func New(apiURL string, t *forge.Transport) (*Client, error) {
	c := gh.NewClient(t.Client())
	base, err := url.Parse(strings.TrimRight(apiURL, "/") + "/")
	if err != nil {
		return nil, fmt.Errorf("github: url: %v", forge.RedactError(err))
	}
	c.BaseURL = base
	return &Client{gh: c, RunnerGroupID: 1}, nil
}

// apiErr turns go-github's errors into forge errors (a status, the
// message; 404 is forge.ErrNotFound).
func apiErr(err error) error {
	var er *gh.ErrorResponse
	var rl *gh.RateLimitError
	var ab *gh.AbuseRateLimitError
	switch {
	case errors.As(err, &er) && er.Response != nil:
		return forge.ResponseError(er.Response, er.Message)
	case errors.As(err, &rl) && rl.Response != nil:
		return forge.ResponseError(rl.Response, rl.Message)
	case errors.As(err, &ab) && ab.Response != nil:
		return forge.ResponseError(ab.Response, ab.Message)
	}
	return forge.RedactError(err)
}

func checkScope(s forge.Scope) error {
	if s.Kind != "org" && s.Kind != "repo" {
		return fmt.Errorf("github: scope %q is not supported (use org or repo)", s.Kind)
	}
	return nil
}

func job(repo string, j *gh.WorkflowJob) forge.Job {
	return forge.Job{ID: j.GetID(), RunID: j.GetRunID(), Repo: repo, Name: j.GetName(), Labels: j.Labels,
		Status: j.GetStatus(), Conclusion: j.GetConclusion(), RunnerName: j.GetRunnerName(), URL: j.GetURL(),
		CreatedAt: j.GetCreatedAt().Time, StartedAt: j.GetStartedAt().Time, CompletedAt: j.GetCompletedAt().Time}
}

// Jobs implements forge.Client: the queued and in-progress jobs of the
// queued and in-progress runs of every repository in scope.
func (c *Client) Jobs(ctx context.Context, s forge.Scope) ([]forge.Job, error) {
	if err := checkScope(s); err != nil {
		return nil, err
	}
	repos := []string{s.Owner + "/" + s.Repo}
	if s.Kind == "org" {
		var err error
		if repos, err = c.orgRepos(ctx, s.Owner); err != nil {
			return nil, err
		}
	}
	var out []forge.Job
	for _, repo := range repos {
		owner, name, _ := strings.Cut(repo, "/")
		for _, status := range []string{forge.StatusQueued, forge.StatusInProgress} {
			runs, err := c.runs(ctx, owner, name, status)
			if err != nil {
				return nil, err
			}
			for _, run := range runs {
				jobs, err := c.runJobs(ctx, owner, name, run)
				if err != nil {
					return nil, err
				}
				for _, j := range jobs {
					if st := j.GetStatus(); st == forge.StatusQueued || st == forge.StatusInProgress {
						out = append(out, job(repo, j))
					}
				}
			}
		}
	}
	return out, nil
}

// pages calls list for pages 1, 2, ... while the answer names a next one.
func pages(list func(gh.ListOptions) (*gh.Response, error)) error {
	opt := gh.ListOptions{PerPage: perPage, Page: 1}
	for n := 0; n < 1000; n++ {
		resp, err := list(opt)
		if err != nil {
			return apiErr(err)
		}
		if resp.NextPage == 0 {
			return nil
		}
		opt.Page = resp.NextPage
	}
	return errors.New("github: listing does not end")
}

func (c *Client) orgRepos(ctx context.Context, org string) ([]string, error) {
	var out []string
	err := pages(func(lo gh.ListOptions) (*gh.Response, error) {
		repos, resp, err := c.gh.Repositories.ListByOrg(ctx, org, &gh.RepositoryListByOrgOptions{ListOptions: lo})
		for _, r := range repos {
			if !r.GetArchived() {
				out = append(out, r.GetFullName())
			}
		}
		return resp, err
	})
	return out, err
}

func (c *Client) runs(ctx context.Context, owner, repo, status string) ([]int64, error) {
	var out []int64
	err := pages(func(lo gh.ListOptions) (*gh.Response, error) {
		runs, resp, err := c.gh.Actions.ListRepositoryWorkflowRuns(ctx, owner, repo, &gh.ListWorkflowRunsOptions{Status: status, ListOptions: lo})
		if runs != nil {
			for _, r := range runs.WorkflowRuns {
				out = append(out, r.GetID())
			}
		}
		return resp, err
	})
	return out, err
}

func (c *Client) runJobs(ctx context.Context, owner, repo string, run int64) ([]*gh.WorkflowJob, error) {
	var out []*gh.WorkflowJob
	err := pages(func(lo gh.ListOptions) (*gh.Response, error) {
		jobs, resp, err := c.gh.Actions.ListWorkflowJobs(ctx, owner, repo, run, &gh.ListWorkflowJobsOptions{Filter: "latest", ListOptions: lo})
		if jobs != nil {
			out = append(out, jobs.Jobs...)
		}
		return resp, err
	})
	return out, err
}

// Job implements forge.Client.
func (c *Client) Job(ctx context.Context, j forge.Job) (forge.Job, error) {
	owner, name, ok := strings.Cut(j.Repo, "/")
	if !ok {
		return forge.Job{}, fmt.Errorf("github: job %d has no repository", j.ID)
	}
	wj, _, err := c.gh.Actions.GetWorkflowJobByID(ctx, owner, name, j.ID)
	if err != nil {
		return forge.Job{}, apiErr(err)
	}
	return job(j.Repo, wj), nil
}

// Register implements forge.Client: a JIT config bound to this runner,
// or — where JIT is refused — a registration token.
func (c *Client) Register(ctx context.Context, s forge.Scope, name string, labels []string) (forge.Registration, error) {
	if err := checkScope(s); err != nil {
		return forge.Registration{}, err
	}
	work := "_work"
	req := &gh.GenerateJITConfigRequest{Name: name, RunnerGroupID: c.RunnerGroupID, Labels: forge.LabelNames(labels), WorkFolder: &work}
	var jit *gh.JITRunnerConfig
	var err error
	if s.Kind == "org" {
		jit, _, err = c.gh.Actions.GenerateOrgJITConfig(ctx, s.Owner, req)
	} else {
		jit, _, err = c.gh.Actions.GenerateRepoJITConfig(ctx, s.Owner, s.Repo, req)
	}
	if err == nil && jit.GetEncodedJITConfig() != "" {
		return forge.Registration{JITConfig: jit.GetEncodedJITConfig(), RunnerID: jit.GetRunner().GetID()}, nil
	}
	var ae *forge.APIError
	if err = apiErr(err); err != nil && !(errors.As(err, &ae) && (ae.Status == 403 || ae.Status == 404 || ae.Status == 422)) {
		return forge.Registration{}, err
	}
	var t *gh.RegistrationToken
	if s.Kind == "org" {
		t, _, err = c.gh.Actions.CreateOrganizationRegistrationToken(ctx, s.Owner)
	} else {
		t, _, err = c.gh.Actions.CreateRegistrationToken(ctx, s.Owner, s.Repo)
	}
	if err != nil {
		return forge.Registration{}, apiErr(err)
	}
	if t.GetToken() == "" {
		return forge.Registration{}, errors.New("github: empty registration token")
	}
	return forge.Registration{Token: t.GetToken()}, nil
}

// runnerScope: the runners' endpoints also serve an enterprise (its
// scale sets' runners).
func runnerScope(s forge.Scope) error {
	if s.Kind == "enterprise" {
		return nil
	}
	return checkScope(s)
}

// Runners implements forge.Client.
func (c *Client) Runners(ctx context.Context, s forge.Scope) ([]forge.Runner, error) {
	if err := runnerScope(s); err != nil {
		return nil, err
	}
	var out []forge.Runner
	err := pages(func(lo gh.ListOptions) (*gh.Response, error) {
		opt := &gh.ListRunnersOptions{ListOptions: lo}
		var rs *gh.Runners
		var resp *gh.Response
		var err error
		switch s.Kind {
		case "org":
			rs, resp, err = c.gh.Actions.ListOrganizationRunners(ctx, s.Owner, opt)
		case "enterprise":
			rs, resp, err = c.gh.Enterprise.ListRunners(ctx, s.Owner, opt)
		default:
			rs, resp, err = c.gh.Actions.ListRunners(ctx, s.Owner, s.Repo, opt)
		}
		if rs != nil {
			for _, r := range rs.Runners {
				fr := forge.Runner{ID: r.GetID(), Name: r.GetName(), Status: r.GetStatus(), Busy: r.GetBusy()}
				for _, l := range r.Labels {
					fr.Labels = append(fr.Labels, l.GetName())
				}
				out = append(out, fr)
			}
		}
		return resp, err
	})
	return out, err
}

// DeleteRunner implements forge.Client.
func (c *Client) DeleteRunner(ctx context.Context, s forge.Scope, id int64) error {
	if err := runnerScope(s); err != nil {
		return err
	}
	var err error
	switch s.Kind {
	case "org":
		_, err = c.gh.Actions.RemoveOrganizationRunner(ctx, s.Owner, id)
	case "enterprise":
		_, err = c.gh.Enterprise.RemoveRunner(ctx, s.Owner, id)
	default:
		_, err = c.gh.Actions.RemoveRunner(ctx, s.Owner, s.Repo, id)
	}
	if err = apiErr(err); errors.Is(err, forge.ErrNotFound) {
		return nil
	}
	return err
}

// DisableRunner implements forge.Client: GitHub has no call for it (its
// removal of a runner running a job is refused, 422).
func (c *Client) DisableRunner(context.Context, forge.Scope, int64) (bool, error) { return false, nil }

// VerifyDelivery implements forge.Client: X-Hub-Signature-256 (go-github's
// check). An empty secret never verifies.
func (c *Client) VerifyDelivery(secret, body []byte, h http.Header) bool {
	sig := h.Get("X-Hub-Signature-256")
	return len(secret) > 0 && sig != "" && gh.ValidateSignature(sig, body, secret) == nil
}
