package hooks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// HookRequest is what an extension receives.
type HookRequest struct {
	APIVersion   string         `json:"apiVersion"`
	Kind         string         `json:"kind"`
	UID          string         `json:"uid"`
	Phase        string         `json:"phase"`
	Method       string         `json:"method"`
	RequestID    string         `json:"requestId"`
	DirectorUUID string         `json:"directorUuid"`
	ObjectType   string         `json:"objectType"`
	Settings     map[string]any `json:"settings,omitempty"`
	Arguments    []any          `json:"arguments"`
	Context      map[string]any `json:"context,omitempty"`
	Result       *PostResult    `json:"result,omitempty"`
}

// PostResult is the post phase's outcome as sent.
type PostResult struct {
	Status string         `json:"status"`
	Value  any            `json:"value,omitempty"`
	Error  map[string]any `json:"error,omitempty"`
}

// HookResponse is what an extension answers.
type HookResponse struct {
	APIVersion        string   `json:"apiVersion"`
	Kind              string   `json:"kind"`
	UID               string   `json:"uid"`
	Status            string   `json:"status"`
	Message           string   `json:"message"`
	RetryAfterSeconds int      `json:"retryAfterSeconds"`
	Warnings          []string `json:"warnings"`
}

const apiVersion = "cpi.hooks/v1"

func (r *Runner) client(e *Extension) *http.Client {
	return &http.Client{
		Timeout:   time.Duration(e.TimeoutSeconds) * time.Second,
		Transport: &http.Transport{TLSClientConfig: e.tls, Proxy: nil, DisableKeepAlives: true},
		// Redirects are refused: an extension answers where it was asked.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// callExtension POSTs one hook request and maps the answer to an outcome.
// Call errors (transport, status, body, uid) fall under failurePolicy;
// an explicit Failure never does.
func (r *Runner) callExtension(ctx context.Context, c *Call, phase string, e *Extension, res *Result) hookResult {
	h := hookResult{kind: "http", name: e.Name}
	start := r.now()
	defer func() { h.duration = r.now().Sub(start); r.record(c, phase, h) }()

	req := HookRequest{APIVersion: apiVersion, Kind: "HookRequest", UID: r.uid, Phase: phase, Method: c.Method,
		RequestID: c.RequestID, DirectorUUID: c.DirectorUUID, ObjectType: c.ObjectType, Settings: e.Settings,
		Arguments: c.Args, Context: c.Context}
	if res != nil {
		pr := &PostResult{Status: res.Status, Value: res.Value}
		if res.Status == "error" {
			pr.Error = map[string]any{"type": res.ErrorType, "message": res.ErrorMsg}
		}
		req.Result = pr
	}
	resp, code, err := r.post(ctx, e, phase, c.Method, req)
	h.httpCode = code
	if err != nil {
		if e.FailurePolicy == "Ignore" {
			h.outcome, h.message = "ignored", "failurePolicy Ignore: "+err.Error()
		} else {
			h.outcome, h.message = "error", err.Error()
		}
		return h
	}
	h.message = resp.Message
	switch {
	case resp.Status == "Failure":
		h.outcome = "deny"
		if phase == "post" {
			h.outcome = "fail"
		}
	case resp.RetryAfterSeconds > 0 && phase == "pre":
		h.outcome, h.retryAfter = "defer", resp.RetryAfterSeconds
	default:
		h.outcome = "success"
	}
	if len(resp.Warnings) > 0 {
		h.message = strings.TrimSpace(h.message + " warnings: " + strings.Join(resp.Warnings, "; "))
	}
	return h
}

func (r *Runner) post(ctx context.Context, e *Extension, phase, method string, body HookRequest) (*HookResponse, int, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, 0, err
	}
	// The method's path goes before the query, which stays as configured.
	u := *e.base
	u.Path = strings.TrimSuffix(u.Path, "/") + "/v1/" + phase + "/" + method
	u.RawPath = ""
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(b))
	if err != nil {
		return nil, 0, fmt.Errorf("calling %s: %v", e.shown, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hresp, err := r.client(e).Do(hreq)
	if err != nil {
		var ue interface{ Timeout() bool }
		if errors.As(err, &ue) && ue.Timeout() {
			return nil, 0, fmt.Errorf("no answer within %ds", e.TimeoutSeconds)
		}
		return nil, 0, fmt.Errorf("calling %s/v1/%s/%s: %v", strings.TrimSuffix(e.shown, "/"), phase, method, errors.Unwrap(err))
	}
	defer hresp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(hresp.Body, MaxResponseBytes+1))
	if err != nil {
		return nil, hresp.StatusCode, fmt.Errorf("reading answer: %v", err)
	}
	if hresp.StatusCode < 200 || hresp.StatusCode > 299 {
		return nil, hresp.StatusCode, fmt.Errorf("answered HTTP %d", hresp.StatusCode)
	}
	if len(data) > MaxResponseBytes {
		return nil, hresp.StatusCode, fmt.Errorf("answer exceeds %d bytes", MaxResponseBytes)
	}
	var resp HookResponse
	if err := json.Unmarshal(data, &resp); err != nil {
		return nil, hresp.StatusCode, fmt.Errorf("answer is not a HookResponse: %v", err)
	}
	if resp.UID != body.UID {
		return nil, hresp.StatusCode, fmt.Errorf("answer uid %q does not match request uid %q", resp.UID, body.UID)
	}
	if resp.Status != "Success" && resp.Status != "Failure" {
		return nil, hresp.StatusCode, fmt.Errorf("answer status %q is neither Success nor Failure", resp.Status)
	}
	if resp.RetryAfterSeconds < 0 {
		return nil, hresp.StatusCode, fmt.Errorf("answer retryAfterSeconds %d is negative", resp.RetryAfterSeconds)
	}
	return &resp, hresp.StatusCode, nil
}
