package aws

import (
	"errors"
	"fmt"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"

	"github.com/runway-cpi/runway/src/retry"
)

// throttleCodes are the error codes AWS uses for rate limiting.
var throttleCodes = map[string]bool{
	"RequestLimitExceeded": true, "Throttling": true, "ThrottlingException": true,
	"ThrottledException": true, "RequestThrottledException": true, "TooManyRequestsException": true,
	"RequestThrottled": true, "SlowDown": true, "EC2ThrottledException": true,
	"PriorRequestNotComplete": true, "BandwidthLimitExceeded": true, "RequestLimitExceededException": true,
}

// transientCodes are server-side faults worth another try.
var transientCodes = map[string]bool{
	"InternalError": true, "InternalFailure": true, "ServiceUnavailable": true,
	"Unavailable": true, "InternalServerException": true, "ServiceUnavailableException": true,
}

// errCode is the API error code of err, "" if it has none.
func errCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func httpStatus(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// classify is the retry verdict for an SDK error that survived the SDK's
// own retryer: throttles and server faults are waited out within the
// budget; an endpoint that refuses connections or does not resolve is a
// configuration error and fails at once.
func classify(err error) retry.Verdict {
	code := errCode(err)
	switch {
	case throttleCodes[code]:
		return retry.Verdict{Class: retry.Throttle}
	case transientCodes[code], httpStatus(err) >= 500:
		return retry.Verdict{Class: retry.Transient}
	case httpStatus(err) == 429:
		return retry.Verdict{Class: retry.Throttle}
	case code == "" && retry.Network(err).Class == retry.Transient:
		// An error answer whose body broke off (a reset under the read):
		// what it said is unknown, so it is a transport fault.
		return retry.Verdict{Class: retry.Transient}
	case code != "" || httpStatus(err) >= 300:
		return retry.Verdict{Class: retry.Permanent}
	}
	// No answer, or a 2xx whose body broke off: the transport's verdict.
	return retry.Network(err)
}

// isThrottle reports whether err is (or wraps) a rate-limit answer.
func isThrottle(err error) bool { return classify(err).Class == retry.Throttle }

// cloudErr names the operation, the endpoint and says plainly when AWS
// throttled us, so no throttle ever reads as an unknown error.
func (d *Driver) cloudErr(op string, err error) error {
	if isThrottle(err) {
		return fmt.Errorf("aws %s: throttled by AWS (%s) and still throttled after the wait budget: %w", op, errCode(err), err)
	}
	return fmt.Errorf("aws %s (%s): %w", op, d.endpointName(), err)
}

func (d *Driver) endpointName() string {
	if d.cfg.Endpoint != "" {
		return d.cfg.Endpoint
	}
	return "region " + d.cfg.Region
}
