// Package scaleset is the client of GitHub's runner scale sets: the
// Actions service's protocol as actions-runner-controller's listener and
// actions/scaleset speak it (read for facts; docs/orchestrator.md lists
// them), written small on the one forge transport.
//
//   - The admin connection: a registration token from the REST API (POST
//     <scope>/actions/runners/registration-token with the forge's token:
//     a PAT or an App installation's; an enterprise's takes a PAT only),
//     exchanged at POST /actions/runner-registration (Authorization:
//     "RemoteAuth <registration token>", body {url: the scope's GitHub
//     URL, runner_event: "register"}) for the Actions service's URL and
//     an admin token (a JWT, renewed a minute before its exp). A new
//     registration token may not be known there at once: 401 and 403 are
//     tried again, five tries in all with growing waits, as ARC does.
//   - The runner scale set, found by runner group and name or made
//     (_apis/runtime/runnerscalesets), its labels kept equal to the
//     group's.
//   - The message session (…/{id}/sessions): one listener per scale set
//     (409 …SessionConflictException otherwise); its message queue URL
//     and token; the long poll (GET, lastMessageId, 202 or an empty 200
//     when nothing came, X-ScaleSetMaxCapacity each time); messages
//     deleted once handled; on GHES up to 3.19 jobs acquired
//     (…/acquirejobs, 404 on github.com, which assigns them itself); the
//     token refreshed (PATCH) on 401; a session deleted answers 204, or
//     400 RunnerScaleSetSessionExpiredException once the service dropped
//     it.
//   - JIT runner configs (…/generatejitconfig) and runners removed
//     (_apis/distributedtask/pools/0/agents/{id}).
//
// No token, JIT config or message queue URL query is ever put in an
// error or a log line.
package scaleset

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/retry"
)

// APIVersion is the Actions service API version every request names.
const APIVersion = "6.0-preview"

// scaleSetsPath is the scale sets' collection in the Actions service.
const scaleSetsPath = "_apis/runtime/runnerscalesets"

// Config locates one scope's scale sets.
type Config struct {
	// APIURL is the REST API (https://api.github.com, GHES
	// https://host/api/v3).
	APIURL string
	// ConfigURL is the scope's GitHub URL as runners are configured with
	// it: https://github.com/org or https://github.com/owner/repo.
	ConfigURL string
	// Scope is the REST scope the registration token is asked for: org,
	// repo or enterprise.
	Scope forge.Scope
	// REST carries the forge's token (Bearer) for the REST API; Actions
	// carries no credential of its own (each request sets the admin or
	// session token). Both retry within their budget and report to the
	// forge's metrics.
	REST, Actions *forge.Transport
	Now           func() time.Time
	// AdminRetryWait is the first wait before the admin connection is
	// tried again after a 401 or 403 (doubling, at most 20 s; default
	// 1 s).
	AdminRetryWait time.Duration
}

// adminTries is how many times the admin connection is tried (ARC: five).
const adminTries = 5

// Client is one scope's connection to the Actions service. Safe for
// concurrent use.
type Client struct {
	cfg      Config
	rest     *http.Client
	actions  *http.Client
	longPoll *http.Client

	mu         sync.Mutex
	serviceURL string // the Actions service, from the admin connection
	adminToken string
	adminExp   time.Time
	// dropped: scale sets whose labels the service dropped, by the
	// labels asked for (not asked for again).
	dropped map[int]string
}

// LongPollTimeout bounds one message long poll (the service answers 202
// after about 50 s when nothing came).
const LongPollTimeout = 90 * time.Second

// New returns a client; nothing is asked of GitHub until it is used.
func New(cfg Config) (*Client, error) {
	if cfg.Scope.Kind != "org" && cfg.Scope.Kind != "repo" && cfg.Scope.Kind != "enterprise" {
		return nil, fmt.Errorf("scale sets: scope %q is not supported (use org, repo or enterprise)", cfg.Scope.Kind)
	}
	if cfg.REST == nil || cfg.Actions == nil {
		return nil, errors.New("scale sets: both transports are required")
	}
	if _, err := url.Parse(cfg.ConfigURL); err != nil {
		return nil, fmt.Errorf("scale sets: config url: %w", forge.RedactError(err))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.AdminRetryWait <= 0 {
		cfg.AdminRetryWait = time.Second
	}
	return &Client{cfg: cfg, dropped: map[int]string{}, rest: cfg.REST.Client(), actions: cfg.Actions.Client(),
		longPoll: &http.Client{Timeout: LongPollTimeout, Transport: cfg.Actions}}, nil
}

// ConfigURL is the scope's GitHub URL (a runner is configured with it):
// https://github.com/org, …/owner/repo, …/enterprises/name (GHES: its
// host in place of github.com).
func ConfigURL(runnerURL string, s forge.Scope) string {
	u := strings.TrimRight(runnerURL, "/") + "/" + url.PathEscape(s.Owner)
	if s.Kind == "enterprise" {
		u = strings.TrimRight(runnerURL, "/") + "/enterprises/" + url.PathEscape(s.Owner)
	}
	if s.Kind == "repo" {
		u += "/" + url.PathEscape(s.Repo)
	}
	return u
}

// admin returns the Actions service URL and a current admin token,
// renewing them a minute before the token expires (or at once, force).
func (c *Client) admin(ctx context.Context, force bool) (string, string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !force && c.adminToken != "" && c.cfg.Now().Add(time.Minute).Before(c.adminExp) {
		return c.serviceURL, c.adminToken, nil
	}
	regToken, err := c.registrationToken(ctx)
	if err != nil {
		return "", "", err
	}
	var conn struct {
		URL   string `json:"url"`
		Token string `json:"token"`
	}
	body := map[string]string{"url": c.cfg.ConfigURL, "runner_event": "register"}
	u := strings.TrimRight(c.cfg.APIURL, "/") + "/actions/runner-registration"
	hdr := map[string]string{"Authorization": "RemoteAuth " + regToken}
	// The Actions transport: the REST one would put the forge's token in
	// place of the registration token. A new registration token may not
	// be known to the service at once: 401/403 are tried again, five
	// tries with waits doubling from AdminRetryWait (ARC: 1, 2, 4, 8 s).
	wait := c.cfg.AdminRetryWait
	for attempt := 1; ; attempt++ {
		err = c.do(ctx, c.actions, "POST", u, hdr, body, &conn, "the admin connection")
		var e *Error
		if err == nil || attempt == adminTries || !errors.As(err, &e) || (e.Status != 401 && e.Status != 403) {
			break
		}
		if err := retry.SleepContext(ctx, wait); err != nil {
			return "", "", err
		}
		wait = min(wait*2, 20*time.Second)
	}
	if err != nil {
		return "", "", err
	}
	if conn.URL == "" || conn.Token == "" {
		return "", "", &Error{Op: "the admin connection", Message: "the answer lacks the Actions service's url or token"}
	}
	if _, err := url.Parse(conn.URL); err != nil || !strings.HasPrefix(conn.URL, "http") {
		return "", "", &Error{Op: "the admin connection", Message: "the Actions service's url is not an http(s) URL"}
	}
	exp, err := tokenExpiry(conn.Token)
	if err != nil {
		return "", "", &Error{Op: "the admin connection", Message: "the admin token: " + err.Error()}
	}
	c.serviceURL, c.adminToken, c.adminExp = strings.TrimRight(conn.URL, "/"), conn.Token, exp
	return c.serviceURL, c.adminToken, nil
}

// registrationToken asks the REST API for the scope's registration token
// (201 {token, expires_at}).
func (c *Client) registrationToken(ctx context.Context) (string, error) {
	p := "/orgs/" + url.PathEscape(c.cfg.Scope.Owner)
	switch c.cfg.Scope.Kind {
	case "repo":
		p = "/repos/" + url.PathEscape(c.cfg.Scope.Owner) + "/" + url.PathEscape(c.cfg.Scope.Repo)
	case "enterprise":
		p = "/enterprises/" + url.PathEscape(c.cfg.Scope.Owner)
	}
	var t struct {
		Token string `json:"token"`
	}
	u := strings.TrimRight(c.cfg.APIURL, "/") + p + "/actions/runners/registration-token"
	if err := c.do(ctx, c.rest, "POST", u, nil, nil, &t, "a registration token"); err != nil {
		return "", err
	}
	if t.Token == "" {
		return "", &Error{Op: "a registration token", Message: "the answer holds no token"}
	}
	return t.Token, nil
}

// tokenExpiry reads a JWT's exp claim (unverified: the service checks
// its own tokens; Runway only needs to know when to renew).
func tokenExpiry(jwt string) (time.Time, error) {
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return time.Time{}, errors.New("not a JWT")
	}
	b, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(parts[1], "="))
	if err != nil {
		return time.Time{}, errors.New("its claims are not base64url")
	}
	var claims struct {
		Exp json.Number `json:"exp"`
	}
	if err := json.Unmarshal(b, &claims); err != nil {
		return time.Time{}, errors.New("its claims are not JSON")
	}
	exp, err := claims.Exp.Int64()
	if err != nil || exp <= 0 {
		return time.Time{}, errors.New("it has no exp claim")
	}
	return time.Unix(exp, 0), nil
}

// service sends one admin request to the Actions service (path relative
// to it, its query without api-version). A 401 renews the admin
// connection and tries once more.
func (c *Client) service(ctx context.Context, method, path string, in, out any, op string) error {
	for attempt := 0; ; attempt++ {
		base, token, err := c.admin(ctx, attempt > 0)
		if err != nil {
			return err
		}
		err = c.do(ctx, c.actions, method, serviceURL(base, path), map[string]string{"Authorization": "Bearer " + token}, in, out, op)
		if attempt == 0 && errors.Is(err, ErrUnauthorized) {
			continue
		}
		return err
	}
}

// serviceURL joins the Actions service URL and a path with its query,
// adding api-version.
func serviceURL(base, path string) string {
	p, q, _ := strings.Cut(path, "?")
	if q != "" {
		q += "&"
	}
	return base + "/" + strings.TrimLeft(p, "/") + "?" + q + "api-version=" + APIVersion
}

// maxAnswer bounds any answer read into memory (a message batch
// included: maxMessage is checked separately, smaller).
const maxAnswer = 8 << 20

// do sends one request (in as JSON unless nil, hdr over the transport's
// headers) and decodes a 2xx answer into out (when not nil). Any other
// answer is an *Error with the service's exception name and message.
func (c *Client) do(ctx context.Context, hc *http.Client, method, u string, hdr map[string]string, in, out any, op string) error {
	resp, err := c.send(ctx, hc, method, u, hdr, in)
	if err != nil {
		return &Error{Op: op, Err: forge.RedactError(err)}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer+1))
	if err != nil {
		return &Error{Op: op, Status: resp.StatusCode, Err: forge.RedactError(err)}
	}
	if resp.StatusCode/100 != 2 {
		return answerError(op, resp, body)
	}
	if len(body) > maxAnswer {
		return &Error{Op: op, Status: resp.StatusCode, Message: fmt.Sprintf("the answer is over %d bytes: refused", maxAnswer)}
	}
	if out == nil || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusAccepted {
		return nil
	}
	if err := json.Unmarshal(bytes.TrimPrefix(body, []byte("\xef\xbb\xbf")), out); err != nil {
		return &Error{Op: op, Status: resp.StatusCode, Message: "the answer is not the expected JSON: " + err.Error()}
	}
	return nil
}

// send makes and sends one request.
func (c *Client) send(ctx context.Context, hc *http.Client, method, u string, hdr map[string]string, in any) (*http.Response, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return nil, err
		}
	}
	var rd io.Reader = http.NoBody
	if in != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return hc.Do(req)
}
