// Package gitea is the orchestrator's Gitea client on Gitea's Go SDK
// (code.gitea.io/sdk/gitea): the actions jobs queue, the scope's runner
// registration token, the runners list, and webhook signatures, as Gitea
// 1.26 serves them.
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

	sdk "code.gitea.io/sdk/gitea"

	"github.com/runway-cpi/runway/src/forge"
)

// PageLimit is Gitea's cap on `limit`.
const PageLimit = 50

// Client talks to one Gitea instance.
type Client struct {
	api forge.GiteaAPI

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

// New returns a client for baseURL (the instance URL, without /api/v1)
// over t, which carries the token ("token <value>").
func New(baseURL string, t *forge.Transport) *Client {
	return &Client{api: forge.NewGiteaAPI(baseURL, t), tokens: map[string]cachedToken{}}
}

// sdk is the SDK's client for one call: its context is per client, so
// each call has its own (they are cheap; the HTTP client is shared). The
// server version is not asked: every endpoint used is in Gitea 1.26.
func (c *Client) sdk(ctx context.Context) *sdk.Client {
	cl, _ := sdk.NewClient(c.api.Base, sdk.SetHTTPClient(c.api.HTTP), sdk.SetContext(ctx), sdk.SetGiteaVersion(""))
	return cl
}

// apiErr turns the SDK's answer into forge errors (a status, the
// message; 404 is forge.ErrNotFound).
func apiErr(resp *sdk.Response, err error) error {
	if err == nil {
		return nil
	}
	if resp != nil && resp.Response != nil && resp.StatusCode/100 != 2 {
		return forge.ResponseError(resp.Response, err.Error())
	}
	return forge.RedactError(err)
}

// scope is what the SDK's per-scope calls need.
type scope struct {
	kind, owner, repo string
	path              string // the API prefix owning its actions resources
}

func scopeOf(s forge.Scope) (scope, error) {
	path, err := s.APIPrefix()
	return scope{kind: s.Kind, owner: s.Owner, repo: s.Repo, path: path}, err
}

func job(j *sdk.ActionWorkflowJob) forge.Job {
	return forge.Job{ID: j.ID, RunID: j.RunID, Repo: RepoFromURL(j.URL), Name: j.Name, Labels: j.Labels, Status: j.Status,
		Conclusion: j.Conclusion, RunnerName: j.RunnerName, URL: j.URL, CreatedAt: forge.Time(j.CreatedAt),
		StartedAt: forge.Time(j.StartedAt), CompletedAt: forge.Time(j.CompletedAt)}
}

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
//
// Hand-written: the SDK's List*ActionJobs send one status, and Gitea
// takes several; one listing of both keeps the snapshot whole (a job
// moving between two listings would be in neither) and costs half the
// requests.
func (c *Client) Jobs(ctx context.Context, s forge.Scope) ([]forge.Job, error) {
	sc, err := scopeOf(s)
	if err != nil {
		return nil, err
	}
	var out []forge.Job
	for page := 1; page <= 10000; page++ {
		q := url.Values{"status": {forge.StatusQueued, forge.StatusInProgress},
			"page": {strconv.Itoa(page)}, "limit": {strconv.Itoa(PageLimit)}}
		var body sdk.ActionWorkflowJobsResponse
		if err := c.get(ctx, sc.path+"/actions/jobs?"+q.Encode(), &body); err != nil {
			return nil, err
		}
		for _, j := range body.Jobs {
			out = append(out, job(j))
		}
		if len(body.Jobs) < PageLimit || int64(len(out)) >= body.TotalCount {
			return out, nil
		}
	}
	return nil, errors.New("gitea: jobs listing does not end")
}

// get is a GET of the API (path with its query) into out.
func (c *Client) get(ctx context.Context, path string, out any) error {
	return c.api.Do(ctx, "GET", path, nil, out)
}

// Job implements forge.Client.
func (c *Client) Job(ctx context.Context, j forge.Job) (forge.Job, error) {
	owner, name, ok := strings.Cut(j.Repo, "/")
	if !ok {
		return forge.Job{}, fmt.Errorf("gitea: job %d has no repository", j.ID)
	}
	aj, resp, err := c.sdk(ctx).GetRepoActionJob(owner, name, j.ID)
	if err != nil {
		return forge.Job{}, apiErr(resp, err)
	}
	return job(aj), nil
}

// Register implements forge.Client: Gitea has one reusable token per scope.
func (c *Client) Register(ctx context.Context, s forge.Scope, _ string, _ []string) (forge.Registration, error) {
	sc, err := scopeOf(s)
	if err != nil {
		return forge.Registration{}, err
	}
	c.mu.Lock()
	t, ok := c.tokens[sc.path]
	c.mu.Unlock()
	if ok && time.Since(t.at) < tokenTTL {
		return forge.Registration{Token: t.token}, nil
	}
	token, err := c.registrationToken(ctx, sc)
	if err != nil {
		return forge.Registration{}, err
	}
	c.mu.Lock()
	c.tokens[sc.path] = cachedToken{token: token, at: time.Now()}
	c.mu.Unlock()
	return forge.Registration{Token: token}, nil
}

func (c *Client) registrationToken(ctx context.Context, sc scope) (string, error) {
	cl := c.sdk(ctx)
	var t *sdk.RegistrationToken
	var resp *sdk.Response
	var err error
	switch sc.kind {
	case "global":
		t, resp, err = cl.CreateAdminActionRunnerRegistrationToken()
	case "org":
		t, resp, err = cl.CreateOrgActionRunnerRegistrationToken(sc.owner)
	case "user":
		t, resp, err = cl.CreateUserActionRunnerRegistrationToken()
	default:
		t, resp, err = cl.CreateRepoActionRunnerRegistrationToken(sc.owner, sc.repo)
	}
	if err != nil {
		return "", apiErr(resp, err)
	}
	if t == nil || t.Token == "" {
		return "", fmt.Errorf("POST %s/actions/runners/registration-token: empty registration token", sc.path)
	}
	return t.Token, nil
}

// Runners implements forge.Client.
func (c *Client) Runners(ctx context.Context, s forge.Scope) ([]forge.Runner, error) {
	sc, err := scopeOf(s)
	if err != nil {
		return nil, err
	}
	cl := c.sdk(ctx)
	var out []forge.Runner
	for page := 1; page <= 10000; page++ {
		opt := sdk.ListActionRunnersOptions{ListOptions: sdk.ListOptions{Page: page, PageSize: PageLimit}}
		var rs *sdk.ActionRunnersResponse
		var resp *sdk.Response
		switch sc.kind {
		case "global":
			rs, resp, err = cl.ListAdminActionRunners(opt)
		case "org":
			rs, resp, err = cl.ListOrgActionRunners(sc.owner, opt)
		case "user":
			rs, resp, err = cl.ListUserActionRunners(opt)
		default:
			rs, resp, err = cl.ListRepoActionRunners(sc.owner, sc.repo, opt)
		}
		if err != nil {
			return nil, apiErr(resp, err)
		}
		for _, r := range rs.Runners {
			fr := forge.Runner{ID: r.ID, Name: r.Name, Status: r.Status, Busy: r.Busy}
			for _, l := range r.Labels {
				fr.Labels = append(fr.Labels, l.Name)
			}
			out = append(out, fr)
		}
		if len(rs.Runners) < PageLimit || int64(len(out)) >= rs.TotalCount {
			break
		}
	}
	return out, nil
}

// DeleteRunner implements forge.Client.
func (c *Client) DeleteRunner(ctx context.Context, s forge.Scope, id int64) error {
	sc, err := scopeOf(s)
	if err != nil {
		return err
	}
	cl := c.sdk(ctx)
	var resp *sdk.Response
	switch sc.kind {
	case "global":
		resp, err = cl.DeleteAdminActionRunner(id)
	case "org":
		resp, err = cl.DeleteOrgActionRunner(sc.owner, id)
	case "user":
		resp, err = cl.DeleteUserActionRunner(id)
	default:
		resp, err = cl.DeleteRepoActionRunner(sc.owner, sc.repo, id)
	}
	if err = apiErr(resp, err); errors.Is(err, forge.ErrNotFound) {
		return nil
	}
	return err
}

// DisableRunner implements forge.Client: PATCH the runner's disabled
// flag (Gitea 1.26); a disabled runner fetches no task.
func (c *Client) DisableRunner(ctx context.Context, s forge.Scope, id int64) (bool, error) {
	sc, err := scopeOf(s)
	if err != nil {
		return false, err
	}
	cl := c.sdk(ctx)
	opt := sdk.EditActionRunnerOption{Disabled: new(true)}
	var resp *sdk.Response
	switch sc.kind {
	case "global":
		_, resp, err = cl.UpdateAdminActionRunner(id, opt)
	case "org":
		_, resp, err = cl.UpdateOrgActionRunner(sc.owner, id, opt)
	case "user":
		_, resp, err = cl.UpdateUserActionRunner(id, opt)
	default:
		_, resp, err = cl.UpdateRepoActionRunner(sc.owner, sc.repo, id, opt)
	}
	return err == nil, apiErr(resp, err)
}

// VerifyDelivery implements forge.Client: X-Gitea-Signature, the hex
// HMAC-SHA256 of the body (the SDK's check). An empty secret never
// verifies.
func (c *Client) VerifyDelivery(secret, body []byte, h http.Header) bool {
	sig := h.Get("X-Gitea-Signature")
	if len(secret) == 0 || sig == "" {
		return false
	}
	ok, err := sdk.VerifyWebhookSignature(string(secret), sig, body)
	return err == nil && ok
}
