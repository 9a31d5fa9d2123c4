package openstack

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"

	"github.com/runway-cpi/runway/src/retry"
)

// status is the HTTP status of an API error, 0 if it has none.
func status(err error) int {
	var ue gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &ue) {
		return ue.Actual
	}
	var up *gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &up) {
		return up.Actual
	}
	return 0
}

func isNotFound(err error) bool { return status(err) == 404 }

// responseOf returns the error's body and headers, if it has them.
func responseOf(err error) ([]byte, map[string][]string) {
	var ue gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &ue) {
		return ue.Body, ue.ResponseHeader
	}
	var up *gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &up) {
		return up.Body, up.ResponseHeader
	}
	return nil, nil
}

// retryAfter reads the Retry-After header, else Nova's overLimit
// "retryAfter" body field (seconds).
func retryAfter(err error) time.Duration {
	body, hdr := responseOf(err)
	if v := firstHeader(hdr, "Retry-After"); v != "" {
		if d := retry.ParseRetryAfter(v, time.Now()); d > 0 {
			return d
		}
	}
	var b struct {
		OverLimit struct {
			RetryAfter any `json:"retryAfter"`
		} `json:"overLimit"`
	}
	if json.Unmarshal(body, &b) == nil {
		switch v := b.OverLimit.RetryAfter.(type) {
		case string:
			if n, err := strconv.Atoi(v); err == nil && n >= 0 {
				return time.Duration(n) * time.Second
			}
		case float64:
			if v >= 0 {
				return time.Duration(v * float64(time.Second))
			}
		}
	}
	return 0
}

func firstHeader(h map[string][]string, k string) string {
	for key, v := range h {
		if strings.EqualFold(key, k) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

// classify is the retry verdict for an API error: 413 (Nova's overLimit)
// and 429 are throttles honouring Retry-After; 500/502/503/504 and
// connection resets are transient; an endpoint that refuses connections
// or does not resolve is a configuration error and fails at once.
func classify(err error) retry.Verdict {
	switch s := status(err); {
	case s == 413 || s == 429:
		return retry.Verdict{Class: retry.Throttle, RetryAfter: retryAfter(err)}
	case s == 500 || s == 502 || s == 503 || s == 504:
		return retry.Verdict{Class: retry.Transient}
	case s != 0:
		return retry.Verdict{Class: retry.Permanent}
	}
	return retry.Network(err)
}

// apiMessage pulls the human message out of an OpenStack error body
// ({"itemNotFound": {"message": …}}, {"NeutronError": {"message": …}},
// {"badRequest": …}, Glance's {"message": …}), else "".
func apiMessage(err error) string {
	body, _ := responseOf(err)
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return ""
	}
	if m, ok := top["message"]; ok {
		var s string
		if json.Unmarshal(m, &s) == nil {
			return s
		}
	}
	for _, v := range top {
		var inner struct {
			Message string `json:"message"`
		}
		if json.Unmarshal(v, &inner) == nil && inner.Message != "" {
			return inner.Message
		}
	}
	return ""
}

// cloudErr names the operation and the cloud, and says plainly when the
// cloud throttled us, so no throttle ever reads as an unknown error.
func (d *Driver) cloudErr(op string, err error) error {
	if errors.Is(err, retry.ErrBudgetExhausted) && classify(err).Class == retry.Throttle {
		return fmt.Errorf("openstack %s: rate limited by the cloud (HTTP %d) and still limited after the wait budget: %w", op, status(err), err)
	}
	if s := status(err); s != 0 {
		msg := apiMessage(err)
		if msg == "" {
			msg = http400Text(s)
		}
		return &apiError{msg: fmt.Sprintf("openstack %s (%s): HTTP %d: %s", op, d.cfg.AuthURL, s, msg), err: err}
	}
	return fmt.Errorf("openstack %s (%s): %w", op, d.cfg.AuthURL, err)
}

func http400Text(s int) string {
	switch s {
	case 400:
		return "bad request"
	case 401:
		return "unauthorized"
	case 403:
		return "forbidden (the user's roles do not allow this)"
	case 404:
		return "not found"
	case 409:
		return "conflict"
	}
	return "unexpected answer"
}

// apiError reads as the cloud's own message but keeps the cause for
// errors.Is/As (status, retry verdicts).
type apiError struct {
	msg string
	err error
}

func (e *apiError) Error() string { return e.msg }
func (e *apiError) Unwrap() error { return e.err }
