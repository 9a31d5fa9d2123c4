package faultproxy

import (
	"fmt"
	"net/http"
	"strings"
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
