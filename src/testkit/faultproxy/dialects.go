package faultproxy

import (
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"sync/atomic"
)

// AWS answers like EC2 (query protocol: XML errors, throttles as 503
// RequestLimitExceeded) and like the JSON REST services such as EBS direct
// (429 ThrottlingException), per the AWS API references.
var AWS = Dialect{
	Throttle: func(r *http.Request) Reply {
		if isQuery(r) {
			return ec2Error(http.StatusServiceUnavailable, "RequestLimitExceeded", "Request limit exceeded.")
		}
		return restError(http.StatusTooManyRequests, "ThrottlingException", "Rate exceeded")
	},
	ServerError: func(r *http.Request) Reply {
		if isQuery(r) {
			return ec2Error(http.StatusServiceUnavailable, "Unavailable", "The server is overloaded and can't handle the request.")
		}
		return restError(http.StatusServiceUnavailable, "ServiceUnavailableException", "Service unavailable")
	},
}

func isQuery(r *http.Request) bool {
	return strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded")
}

func ec2Error(status int, code, msg string) Reply {
	body := fmt.Sprintf(`<?xml version="1.0" encoding="UTF-8"?>
<Response><Errors><Error><Code>%s</Code><Message>%s</Message></Error></Errors><RequestID>faultproxy-0000</RequestID></Response>`, code, msg)
	return Reply{Status: status, Header: http.Header{"Content-Type": {"text/xml;charset=UTF-8"}}, Body: []byte(body)}
}

func restError(status int, code, msg string) Reply {
	return Reply{Status: status, Header: http.Header{"Content-Type": {"application/json"}, "X-Amzn-Errortype": {code}},
		Body: []byte(fmt.Sprintf(`{"message":%q}`, msg))}
}

// OpenStack answers like Nova, Cinder, Neutron, Glance and Keystone do
// (per their API references): throttles alternate between Nova's 413
// overLimit (Retry-After header and retryAfter in the body) and 429 Too
// Many Requests with Retry-After; server errors are 503 with a JSON fault.
// Every passed response has its loopback endpoint URLs (the Keystone
// catalog, pagination links) rewritten to go through the proxy.
var OpenStack = Dialect{
	Throttle: func(r *http.Request) Reply {
		h := http.Header{"Content-Type": {"application/json"}, "Retry-After": {"1"}}
		if osThrottles.Add(1)%2 == 0 {
			return Reply{Status: http.StatusRequestEntityTooLarge, Header: h,
				Body: []byte(`{"overLimit": {"code": 413, "message": "This request was rate-limited.", "retryAfter": "1"}}`)}
		}
		return Reply{Status: http.StatusTooManyRequests, Header: h,
			Body: []byte(`{"code": 429, "title": "Too Many Requests", "message": "Rate limit exceeded."}`)}
	},
	ServerError: func(r *http.Request) Reply {
		return Reply{Status: http.StatusServiceUnavailable, Header: http.Header{"Content-Type": {"application/json"}},
			Body: []byte(`{"serviceUnavailable": {"code": 503, "message": "The server is currently unavailable. Please try again at a later time."}}`)}
	},
	Rewrite: func(body []byte, proxyURL string) []byte {
		return loopbackURL.ReplaceAll(body, []byte(proxyURL+portPrefix[:len(portPrefix)-1]+"/$2"))
	},
}

var osThrottles atomic.Int64

// loopbackURL matches http://127.0.0.1:PORT and http://localhost:PORT.
var loopbackURL = regexp.MustCompile(`http://(127\.0\.0\.1|localhost):(\d+)`)
