package hooks

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/runway-cpi/runway/src/logging"
)

// Call describes one CPI call to the hooks. Everything in it is already
// redacted: hooks never see secrets.
type Call struct {
	Method       string
	RequestID    string
	DirectorUUID string
	ObjectType   string // vm | disk | snapshot | stemcell | none
	// Args are the redacted positional arguments; Scalars their flattened
	// scalar values by argument name (vm_cid → CPI_VM_CID).
	Args    []any
	Scalars map[string]string
	// Context is the whitelisted request context.
	Context map[string]any
}

// Result is what the method did, for the post phase.
type Result struct {
	Status    string // success | error
	Value     any
	ErrorType string
	ErrorMsg  string
}

// Verdict is the pre phase's decision.
type Verdict struct {
	Deny       bool
	Hook       string // who denied or deferred
	Message    string
	RetryAfter int // seconds; > 0 = defer
}

// Runner runs the hooks of one CPI call.
type Runner struct {
	cfg  *Config
	log  logging.Fields
	uid  string
	now  func() time.Time
	tmp  string // request file dir, made on first use
	logf *os.File
}

// New returns a runner for one call.
func New(cfg *Config, log logging.Logger) *Runner {
	return &Runner{cfg: cfg, log: logging.Fields{Logger: log, Tag: "hooks"}, uid: uuid.NewString(), now: time.Now}
}

// Close removes the call's temporary files.
func (r *Runner) Close() {
	if r.tmp != "" {
		_ = os.RemoveAll(r.tmp)
	}
	if r.logf != nil {
		_ = r.logf.Close()
	}
}

// DeferBudget is how long Pre's caller may wait out defers.
func (r *Runner) DeferBudget() time.Duration {
	return time.Duration(r.cfg.DeferWaitBudgetSeconds) * time.Second
}

// Pre runs scripts (sorted) then extensions (config order). The first deny
// stops; defers aggregate to the lowest non-zero retry-after.
func (r *Runner) Pre(ctx context.Context, c *Call) Verdict {
	var v Verdict
	for _, s := range r.scripts(c.Method, "pre") {
		res := r.runScript(ctx, c, "pre", s, nil)
		if res.outcome == "deny" || res.outcome == "fail" {
			return Verdict{Deny: true, Hook: "script " + res.name, Message: res.message}
		}
	}
	for i := range r.cfg.Extensions {
		e := &r.cfg.Extensions[i]
		if !e.wants(c.Method, "pre") {
			continue
		}
		res := r.callExtension(ctx, c, "pre", e, nil)
		switch res.outcome {
		case "deny", "error":
			return Verdict{Deny: true, Hook: "extension " + e.Name, Message: res.message}
		case "defer":
			if v.RetryAfter == 0 || res.retryAfter < v.RetryAfter {
				v = Verdict{Hook: "extension " + e.Name, Message: res.message, RetryAfter: res.retryAfter}
			}
		}
	}
	return v
}

// Post runs every post hook; nothing they do changes the CPI's answer.
func (r *Runner) Post(ctx context.Context, c *Call, res Result) {
	for _, s := range r.scripts(c.Method, "post") {
		r.runScript(ctx, c, "post", s, &res)
	}
	for i := range r.cfg.Extensions {
		e := &r.cfg.Extensions[i]
		if e.wants(c.Method, "post") {
			r.callExtension(ctx, c, "post", e, &res)
		}
	}
}

// hookResult is one invocation's outcome, as audited.
type hookResult struct {
	kind       string // script | http
	name       string
	outcome    string // success | skip | fail | deny | defer | error | ignored
	exitCode   *int
	httpCode   int
	retryAfter int
	duration   time.Duration
	message    string
}

type auditLine struct {
	TS         string `json:"ts"`
	RequestID  string `json:"requestId"`
	UID        string `json:"uid"`
	Method     string `json:"method"`
	Phase      string `json:"phase"`
	Kind       string `json:"kind"`
	Name       string `json:"name"`
	Outcome    string `json:"outcome"`
	ExitCode   *int   `json:"exitCode,omitempty"`
	HTTPCode   int    `json:"httpCode,omitempty"`
	RetryAfter int    `json:"retryAfterSeconds"`
	DurationMs int64  `json:"durationMs"`
	Message    string `json:"message,omitempty"`
}

// record writes the audit line (one O_APPEND write, so lines from
// concurrent bin/cpi processes never interleave) and the summary line.
func (r *Runner) record(c *Call, phase string, h hookResult) {
	kv := []any{"phase", phase, "method", c.Method, "kind", h.kind, "hook", h.name, "outcome", h.outcome}
	switch {
	case h.exitCode != nil:
		kv = append(kv, "exit", *h.exitCode)
	case h.httpCode != 0:
		kv = append(kv, "http", h.httpCode)
	}
	if h.retryAfter > 0 {
		kv = append(kv, "retry_after_s", h.retryAfter)
	}
	kv = append(kv, "duration", h.duration.Round(time.Millisecond))
	if h.message != "" {
		kv = append(kv, "message", h.message)
	}
	r.log.Info("hook ran", kv...)
	line, _ := json.Marshal(auditLine{TS: r.now().UTC().Format(time.RFC3339Nano), RequestID: c.RequestID, UID: r.uid,
		Method: c.Method, Phase: phase, Kind: h.kind, Name: h.name, Outcome: h.outcome, ExitCode: h.exitCode,
		HTTPCode: h.httpCode, RetryAfter: h.retryAfter, DurationMs: h.duration.Milliseconds(), Message: h.message})
	if err := os.MkdirAll(filepath.Dir(r.cfg.AuditLog), 0o700); err == nil {
		f, err := os.OpenFile(r.cfg.AuditLog, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err == nil {
			_, err = f.Write(append(line, '\n'))
			f.Close()
		}
		if err != nil {
			r.log.Warn("writing the audit log failed", "path", r.cfg.AuditLog, "err", err)
		}
	}
}

// requestFile writes the redacted request once per call (0600).
func (r *Runner) requestFile(c *Call) (string, error) {
	if r.tmp == "" {
		dir, err := os.MkdirTemp("", "runway-hook-")
		if err != nil {
			return "", err
		}
		r.tmp = dir
		b, _ := json.Marshal(map[string]any{"method": c.Method, "arguments": c.Args, "context": c.Context})
		if err := os.WriteFile(filepath.Join(dir, "request.json"), b, 0o600); err != nil {
			return "", err
		}
	}
	return filepath.Join(r.tmp, "request.json"), nil
}

// env builds a script's whole environment.
func (r *Runner) env(c *Call, phase string, res *Result) []string {
	e := map[string]string{
		"PATH":              "/usr/sbin:/usr/bin:/sbin:/bin",
		"CPI_HOOKS_VERSION": "1",
		"CPI_HOOKS_PHASE":   phase,
		"CPI_OP_CODE":       c.Method,
		"CPI_OBJECT_TYPE":   c.ObjectType,
		"CPI_REQUEST_ID":    c.RequestID,
		"CPI_DIRECTOR_UUID": c.DirectorUUID,
		"CPI_HOOK_UID":      r.uid,
	}
	if p, err := r.requestFile(c); err == nil {
		e["CPI_REQUEST_FILE"] = p
	}
	for k, v := range c.Scalars {
		e["CPI_"+strings.ToUpper(k)] = v
	}
	if res != nil {
		e["CPI_POST_STATUS"] = res.Status
		if res.Value != nil {
			b, _ := json.Marshal(res.Value)
			e["CPI_POST_RESULT"] = string(b)
		}
		e["CPI_POST_ERROR_TYPE"] = res.ErrorType
		e["CPI_POST_ERROR_MESSAGE"] = res.ErrorMsg
	}
	out := make([]string, 0, len(e))
	for k, v := range e {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}
