// Package hooks runs lifecycle hooks around every CPI method: local
// <method>-pre.d / -post.d script directories (Ganeti semantics) and HTTP
// runtime extensions (Cluster API Runtime SDK semantics). The contract is
// docs/hooks.md.
package hooks

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"strings"

	"github.com/runway-cpi/runway/src/strict"
)

// Config is the "hooks" section of the CPI config.
type Config struct {
	Dir                    string      `json:"dir,omitempty"`
	ScriptTimeoutSeconds   int         `json:"script_timeout_seconds,omitempty"`
	ScriptGraceSeconds     int         `json:"script_grace_seconds,omitempty"`
	AuditLog               string      `json:"audit_log,omitempty"`
	LogDir                 string      `json:"log_dir,omitempty"`
	LogCapBytes            int64       `json:"log_cap_bytes,omitempty"`
	DeferWaitBudgetSeconds int         `json:"defer_wait_budget_seconds,omitempty"`
	Extensions             []Extension `json:"extensions,omitempty"`
}

// Extension is one HTTP runtime extension.
type Extension struct {
	Name           string         `json:"name"`
	Operations     []string       `json:"operations,omitempty"` // methods; empty or "*" = all
	Phases         []string       `json:"phases,omitempty"`     // pre, post; empty = both
	ClientConfig   ClientConfig   `json:"clientConfig"`
	TimeoutSeconds int            `json:"timeoutSeconds,omitempty"`
	FailurePolicy  string         `json:"failurePolicy,omitempty"` // Fail (default) | Ignore
	Settings       map[string]any `json:"settings,omitempty"`

	tls *tls.Config
	// base is the parsed URL; shown is it without query or fragment (they
	// may carry a token), the only form that reaches messages.
	base  *url.URL
	shown string
}

// ClientConfig says how to reach an extension.
type ClientConfig struct {
	URL        string `json:"url"`
	CABundle   string `json:"caBundle,omitempty"`
	ClientCert string `json:"clientCert,omitempty"`
	ClientKey  string `json:"clientKey,omitempty"`
}

// Defaults.
const (
	DefaultScriptTimeout = 30
	DefaultScriptGrace   = 5
	DefaultExtTimeout    = 5
	DefaultLogCap        = 1 << 20
	MaxResponseBytes     = 1 << 20
)

// ParseConfig validates the hooks section; stateDir places default log
// files. Errors name the field.
func ParseConfig(raw json.RawMessage, stateDir string, knownMethod func(string) bool) (*Config, error) {
	var c Config
	if err := strict.JSON("hooks", raw, &c); err != nil {
		return nil, err
	}
	bad := func(field, format string, a ...any) error {
		return fmt.Errorf("hooks: %s: %s", field, fmt.Sprintf(format, a...))
	}
	if c.Dir != "" && !filepath.IsAbs(c.Dir) {
		return nil, bad("dir", "must be an absolute path, got %q", c.Dir)
	}
	if c.ScriptTimeoutSeconds == 0 {
		c.ScriptTimeoutSeconds = DefaultScriptTimeout
	}
	if c.ScriptGraceSeconds == 0 {
		c.ScriptGraceSeconds = DefaultScriptGrace
	}
	if c.ScriptTimeoutSeconds < 0 || c.ScriptGraceSeconds < 0 || c.DeferWaitBudgetSeconds < 0 || c.LogCapBytes < 0 {
		return nil, bad("script_timeout_seconds, script_grace_seconds, defer_wait_budget_seconds, log_cap_bytes", "must not be negative")
	}
	if c.LogCapBytes == 0 {
		c.LogCapBytes = DefaultLogCap
	}
	if c.LogDir == "" {
		c.LogDir = filepath.Join(stateDir, "hooks", "logs")
	}
	if c.AuditLog == "" {
		c.AuditLog = filepath.Join(stateDir, "hooks", "audit.jsonl")
	}
	for _, f := range []struct{ name, v string }{{"log_dir", c.LogDir}, {"audit_log", c.AuditLog}} {
		if !filepath.IsAbs(f.v) {
			return nil, bad(f.name, "must be an absolute path, got %q", f.v)
		}
	}
	names := map[string]bool{}
	for i := range c.Extensions {
		e := &c.Extensions[i]
		field := fmt.Sprintf("extensions[%d]", i)
		if e.Name == "" || !nameRe(e.Name) {
			return nil, bad(field+".name", "must be letters, digits, '_' or '-', got %q", e.Name)
		}
		if names[e.Name] {
			return nil, bad(field+".name", "duplicate extension %q", e.Name)
		}
		names[e.Name] = true
		if err := e.complete(knownMethod, bad); err != nil {
			return nil, err
		}
	}
	return &c, nil
}

// complete checks one extension (named already) and fills in its
// defaults, its parsed URL and its TLS configuration.
func (e *Extension) complete(knownMethod func(string) bool, bad func(field, format string, a ...any) error) error {
	field := "extensions[" + e.Name + "]"
	for _, op := range e.Operations {
		if op != "*" && !knownMethod(op) {
			return bad(field+".operations", "unknown method %q", op)
		}
	}
	for _, ph := range e.Phases {
		if ph != "pre" && ph != "post" {
			return bad(field+".phases", "must be pre or post, got %q", ph)
		}
	}
	if e.TimeoutSeconds == 0 {
		e.TimeoutSeconds = DefaultExtTimeout
	}
	if e.TimeoutSeconds < 1 || e.TimeoutSeconds > 30 {
		return bad(field+".timeoutSeconds", "must be 1 to 30, got %d", e.TimeoutSeconds)
	}
	switch e.FailurePolicy {
	case "":
		e.FailurePolicy = "Fail"
	case "Fail", "Ignore":
	default:
		return bad(field+".failurePolicy", "must be Fail or Ignore, got %q", e.FailurePolicy)
	}
	u, err := url.Parse(e.ClientConfig.URL)
	if err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return bad(field+".clientConfig.url", "must be an http(s) URL, got %q", shownURL(e.ClientConfig.URL))
	}
	if u.Scheme == "http" && !loopback(u.Hostname()) {
		return bad(field+".clientConfig.url", "must use https (plain http is allowed for loopback only), got %q", shownURL(e.ClientConfig.URL))
	}
	if u.User != nil {
		return bad(field+".clientConfig.url", "must not carry credentials")
	}
	u.Fragment, u.RawFragment = "", ""
	e.base, e.shown = u, shownURL(e.ClientConfig.URL)
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if e.ClientConfig.CABundle != "" {
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(e.ClientConfig.CABundle)) {
			return bad(field+".clientConfig.caBundle", "holds no PEM certificate")
		}
		tc.RootCAs = pool
	}
	if (e.ClientConfig.ClientCert == "") != (e.ClientConfig.ClientKey == "") {
		return bad(field+".clientConfig", "clientCert and clientKey go together")
	}
	if e.ClientConfig.ClientCert != "" {
		cert, err := tls.LoadX509KeyPair(e.ClientConfig.ClientCert, e.ClientConfig.ClientKey)
		if err != nil {
			return bad(field+".clientConfig.clientCert", "%v", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	e.tls = tc
	return nil
}

func nameRe(s string) bool {
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return s != ""
}

func loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func (e *Extension) wants(method, phase string) bool {
	ok := len(e.Operations) == 0
	for _, op := range e.Operations {
		ok = ok || op == "*" || op == method
	}
	if !ok {
		return false
	}
	if len(e.Phases) == 0 {
		return true
	}
	for _, p := range e.Phases {
		if p == phase {
			return true
		}
	}
	return false
}

// shownURL is raw without its query and fragment, for messages: a query
// may carry a token.
func shownURL(raw string) string {
	if i := strings.IndexAny(raw, "?#"); i >= 0 {
		return raw[:i]
	}
	return raw
}
