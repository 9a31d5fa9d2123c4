package scaleset

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/runway-cpi/runway/src/clip"
	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/logging"
)

// What the Actions service's answers mean, as its clients read them
// (actions/scaleset errors.go, actions-runner-controller's listener, the
// runner's exception map).
var (
	// ErrSessionConflict: the scale set has a message session already
	// (409 TaskAgentSessionConflictException): another listener holds
	// it, or one that died before deleting it.
	ErrSessionConflict = errors.New("the scale set's message session is held by another listener")
	// ErrUnauthorized: a 401. On the message queue and acquirejobs, the
	// session's token expired (refresh the session); elsewhere the admin
	// token did (renew the admin connection).
	ErrUnauthorized = errors.New("token expired or refused")
	// ErrRunnerExists: a runner of that name is registered
	// (AgentExistsException).
	ErrRunnerExists = errors.New("a runner of that name exists")
	// ErrJobStillRunning: the runner cannot be removed while it runs a
	// job (JobStillRunningException).
	ErrJobStillRunning = errors.New("the runner is still running a job")
	// ErrMessageRefused: a message over the size bound or not the
	// protocol's shape; the listener opens a new session (a new queue).
	ErrMessageRefused = errors.New("message refused")
	// ErrSessionExpired: the service no longer knows the session (400
	// RunnerScaleSetSessionExpiredException on its delete, ARC #4285):
	// it is gone.
	ErrSessionExpired = errors.New("the message session expired")
)

// Error is a failed request to GitHub or the Actions service. It names
// what was asked (Op), never a token; its URL-bearing transport errors
// are redacted.
type Error struct {
	Op        string
	Status    int    // 0: no answer
	Exception string // the service's typeName, e.g. TaskAgentSessionConflictException
	Message   string
	Err       error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("scale sets: " + e.Op)
	if e.Status != 0 {
		fmt.Fprintf(&b, ": HTTP %d", e.Status)
	}
	if e.Exception != "" {
		b.WriteString(" " + e.Exception)
	}
	if e.Message != "" {
		b.WriteString(": " + e.Message)
	}
	if e.Err != nil {
		b.WriteString(": " + e.Err.Error())
	}
	return b.String()
}

// Unwrap answers the sentinel the status and exception mean, and the
// transport error. A 404 is also forge.ErrNotFound (a deleted scale set,
// session or runner).
func (e *Error) Unwrap() []error {
	var out []error
	if e.Err != nil {
		out = append(out, e.Err)
	}
	switch {
	case strings.Contains(e.Exception, "SessionConflict") || (e.Status == http.StatusConflict && strings.Contains(e.Op, "session")):
		out = append(out, ErrSessionConflict)
	case strings.Contains(e.Exception, "AgentExists"):
		out = append(out, ErrRunnerExists)
	case strings.Contains(e.Exception, "JobStillRunning"):
		out = append(out, ErrJobStillRunning, forge.ErrRunnerBusy)
	case strings.Contains(e.Exception, "SessionExpired"):
		out = append(out, ErrSessionExpired)
	}
	switch e.Status {
	case http.StatusUnauthorized:
		out = append(out, ErrUnauthorized)
	case http.StatusNotFound:
		out = append(out, forge.ErrNotFound)
	}
	return out
}

// answerError reads a non-2xx answer: {"typeName", "message"} JSON, or
// text (a BOM trimmed), cut to a readable length, URLs redacted.
func answerError(op string, resp *http.Response, body []byte) *Error {
	e := &Error{Op: op, Status: resp.StatusCode}
	body = []byte(strings.TrimPrefix(string(body), "\xef\xbb\xbf"))
	var ex struct {
		TypeName string `json:"typeName"`
		Message  string `json:"message"`
	}
	if json.Unmarshal(body, &ex) == nil && (ex.TypeName != "" || ex.Message != "") {
		e.Exception, e.Message = clip.To(ex.TypeName, 120), ex.Message
	} else {
		e.Message = strings.TrimSpace(string(body))
	}
	e.Message = logging.RedactURLs(clip.Quote(e.Message, 300))
	return e
}
