package forge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/clip"
	"github.com/runway-cpi/runway/src/retry"
)

// API is a JSON REST client shared by the forge clients: auth header,
// bounded bodies, typed errors, and retries of throttles and transient
// faults inside a small budget (the reconcile loop backs off beyond it).
type API struct {
	Base string // e.g. https://gitea.example.com/api/v1
	Auth string // Authorization header value; never logged
	// AuthFunc, when set, gives the header value for each request
	// instead (a token re-read when its file changes).
	AuthFunc func() string
	Headers  map[string]string
	HTTP     *http.Client
	Retry    retry.Policy
	// Observe is told about every answer: for metrics (requests, rate
	// limit remaining).
	Observe func(method string, status int, h http.Header)
}

// NewAPI returns an API with sane defaults.
func NewAPI(base, auth string) *API {
	p := retry.Default()
	p.Budget = 10 * time.Second
	p.Classify = Classify
	return &API{Base: strings.TrimRight(base, "/"), Auth: auth, HTTP: &http.Client{Timeout: 30 * time.Second}, Retry: p}
}

const maxBody = 16 << 20

// Do sends one request; out (if non-nil) receives the JSON answer. The
// returned header is the last answer's.
func (a *API) Do(ctx context.Context, method, path string, q url.Values, in, out any) (http.Header, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return nil, err
		}
	}
	u := a.Base + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	var hdr http.Header
	err := a.Retry.Do(ctx, method+" "+path, func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, method, u, bytes.NewReader(body))
		if err != nil {
			return err
		}
		auth := a.Auth
		if a.AuthFunc != nil {
			auth = a.AuthFunc()
		}
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		req.Header.Set("Accept", "application/json")
		if in != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range a.Headers {
			req.Header.Set(k, v)
		}
		resp, err := a.HTTP.Do(req)
		if err != nil {
			return redactURLError(err)
		}
		defer resp.Body.Close()
		if a.Observe != nil {
			a.Observe(method, resp.StatusCode, resp.Header)
		}
		hdr = resp.Header
		b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
		if err != nil {
			return err
		}
		if resp.StatusCode/100 != 2 {
			return &APIError{Method: method, URL: a.Base + path, Status: resp.StatusCode, Message: message(b),
				RetryAfter: retry.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now())}
		}
		if out != nil && len(b) > 0 {
			if err := json.Unmarshal(b, out); err != nil {
				return fmt.Errorf("%s %s: decoding answer: %v", method, a.Base+path, err)
			}
		}
		return nil
	})
	return hdr, err
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

// redactURLError drops the query string from a transport error's URL.
func redactURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		if i := strings.IndexByte(ue.URL, '?'); i >= 0 {
			ue.URL = ue.URL[:i]
		}
	}
	return err
}

func message(b []byte) string {
	var m struct {
		Message string `json:"message"`
	}
	if json.Unmarshal(b, &m) == nil && m.Message != "" {
		return m.Message
	}
	return clip.Quote(string(b), 200)
}

// NextPage reads a RFC 5988 Link header's rel="next" page number (0: none).
func NextPage(h http.Header) int {
	for _, part := range strings.Split(h.Get("Link"), ",") {
		if !strings.Contains(part, `rel="next"`) {
			continue
		}
		s, e := strings.IndexByte(part, '<'), strings.IndexByte(part, '>')
		if s < 0 || e < s {
			continue
		}
		u, err := url.Parse(part[s+1 : e])
		if err != nil {
			continue
		}
		if n, err := strconv.Atoi(u.Query().Get("page")); err == nil {
			return n
		}
	}
	return 0
}
