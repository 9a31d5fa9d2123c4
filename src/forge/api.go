package forge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/runway-cpi/runway/src/clip"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/retry"
)

// Transport is the HTTP layer under the forge libraries (go-github, the
// Gitea SDK): the Authorization header, read for every request (a token
// file re-read when it changes), fixed headers, retries of throttles and
// transient faults inside a small budget honouring Retry-After (the
// reconcile loop backs off beyond it), an observer for metrics, and
// transport errors without their query strings. The last answer, whatever
// its status, goes back to the library, which makes its own error of it.
// Under it, GETs are conditional (ETagCache).
type Transport struct {
	Base http.RoundTripper
	// Cred, when set, gives each request's Authorization (in place of
	// AuthFunc): a GitHub App installation's token, minted and kept.
	Cred     Credential
	AuthFunc func() string
	Headers  map[string]string
	Retry    retry.Policy
	// Observe is told about every answer (requests, rate limit left).
	Observe func(method string, status int, h http.Header)
	// UserAgent is sent with every request (NewTransport: UserAgent()),
	// over the library's own.
	UserAgent string
}

// Credential gives a request's Authorization header, for ctx (it may
// have to ask the forge for a token first).
type Credential interface {
	Authorization(ctx context.Context) (string, error)
	// Refused: the forge answered 401 to a request sent with value (a
	// token revoked before its time): it is not sent again.
	Refused(value string)
}

// NewTransport returns a transport sending auth (the header's whole
// value) with every request.
func NewTransport(auth func() string) *Transport {
	p := retry.Default()
	p.Budget = 10 * time.Second
	p.Classify = Classify
	return &Transport{Base: &ETagCache{Base: http.DefaultTransport}, AuthFunc: auth, Retry: p, UserAgent: UserAgent()}
}

// Client is an http.Client over t, bounding each request.
func (t *Transport) Client() *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: t}
}

const maxErrorBody = 1 << 20

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var last *http.Response
	err := t.Retry.Do(req.Context(), req.Method+" "+req.URL.Path, func(ctx context.Context) error {
		r := req.Clone(ctx)
		if req.Body != nil && req.GetBody != nil {
			b, err := req.GetBody()
			if err != nil {
				return err
			}
			r.Body = b
		}
		auth := ""
		switch {
		case t.Cred != nil:
			a, err := t.Cred.Authorization(ctx)
			if err != nil {
				return RedactError(err)
			}
			auth = a
		case t.AuthFunc != nil:
			auth = t.AuthFunc()
		}
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		if t.UserAgent != "" {
			r.Header.Set("User-Agent", t.UserAgent)
		}
		for k, v := range t.Headers {
			r.Header.Set(k, v)
		}
		resp, err := t.Base.RoundTrip(r)
		if err != nil {
			return RedactError(err)
		}
		if t.Observe != nil {
			status := resp.StatusCode
			if resp.Header.Get(FromCacheHeader) != "" {
				status = http.StatusNotModified // what the forge answered
			}
			t.Observe(req.Method, status, resp.Header)
		}
		last = resp
		if resp.StatusCode/100 == 2 {
			return nil
		}
		if resp.StatusCode == http.StatusUnauthorized && t.Cred != nil {
			t.Cred.Refused(auth)
		}
		// Kept for the library (and read once here): the answer may be
		// retried past, or be the one the caller sees.
		b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
		resp.Body.Close()
		resp.Body = io.NopCloser(bytes.NewReader(b))
		return ResponseError(resp, message(b))
	})
	var ae *APIError
	if last != nil && (err == nil || errors.As(err, &ae)) {
		return last, nil
	}
	return nil, err
}

// ResponseError is the forge error of a non-2xx answer.
func ResponseError(resp *http.Response, msg string) *APIError {
	e := &APIError{Status: resp.StatusCode, Message: msg,
		RetryAfter: retry.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
	if resp.Request != nil {
		u := *resp.Request.URL
		u.RawQuery, u.User = "", nil
		e.Method, e.URL = resp.Request.Method, u.String()
	}
	return e
}

// Classify sorts forge errors for retry.Policy.
func Classify(err error) retry.Verdict {
	var ae *APIError
	if errors.As(err, &ae) {
		switch {
		case ae.Status == 429 || (ae.Status == 403 && ae.RetryAfter > 0):
			return retry.Verdict{Class: retry.Throttle, RetryAfter: ae.RetryAfter}
		case ae.Status >= 500:
			return retry.Verdict{Class: retry.Transient}
		}
		return retry.Verdict{Class: retry.Permanent}
	}
	// No answer: the same rule as every other HTTP client here (a refused
	// or unresolvable endpoint is a wrong URL; the reconcile loop, not
	// this call, comes back to it).
	return retry.Network(err)
}

// RedactError is err with every URL in it redacted by logging.RedactURLs
// (user info and query values): a *url.Error's URL in place, and the
// message of any other error naming one. net/http's errors carry the
// whole request URL (a forge URL's user, and its query token, with it),
// and go-github's name its base URL: every client's errors pass here.
func RedactError(err error) error {
	if err == nil {
		return nil
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = logging.RedactURLs(ue.URL)
	}
	if msg := err.Error(); logging.RedactURLs(msg) != msg {
		return redactedError{err}
	}
	return err
}

// redactedError says what err says, redacted; errors.Is and As still
// see err.
type redactedError struct{ err error }

func (e redactedError) Error() string { return logging.RedactURLs(e.err.Error()) }
func (e redactedError) Unwrap() error { return e.err }

func message(b []byte) string {
	var m struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(b, &m) == nil && m.Message != "" {
		return m.Message
	}
	return clip.Quote(string(b), 200)
}
