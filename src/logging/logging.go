// Package logging is Runway's one logging stack: bosh-utils' logger (the
// BOSH Director's and every BOSH CPI's format) behind a redactor. A CPI
// call's logger writes to stderr and, at the same time, into the buffer
// returned as the response `log`; a daemon's writes to stderr. Every
// package logs in one style, a message then key=value pairs (Fields).
// Registered secrets reach neither.
package logging

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"

	boshlog "github.com/cloudfoundry/bosh-utils/logger"
)

// EnvLevel overrides the configured level, like BOSH_LOG_LEVEL for bosh-cli.
const EnvLevel = "RUNWAY_LOG_LEVEL"

// Logger is the logger every package receives.
type Logger = boshlog.Logger

// Call is the logging state of one CPI call.
type Call struct {
	Logger
	redactor *Redactor
	buf      *bytes.Buffer
	mu       *sync.Mutex
}

// ParseLevel resolves the effective level: env override, then configured,
// then "info".
func ParseLevel(configured string) (boshlog.LogLevel, error) {
	s := configured
	if env := os.Getenv(EnvLevel); env != "" {
		s = env
	} else if env := os.Getenv("BOSH_LOG_LEVEL"); env != "" {
		s = env
	}
	if s == "" {
		s = "info"
	}
	return Level(s)
}

// Level parses a configured level: debug, info, warn, error or none (any
// case).
func Level(s string) (boshlog.LogLevel, error) {
	l, err := boshlog.Levelify(s)
	if err != nil {
		return l, fmt.Errorf("log level %q: want debug, info, warn, error or none", s)
	}
	return l, nil
}

// New returns a daemon's logger writing to w, and the redactor every
// line passes through (register the daemon's secrets with it).
func New(level boshlog.LogLevel, w io.Writer) (Logger, *Redactor) {
	r := &Redactor{}
	return boshlog.NewWriterLogger(level, r.Writer(&lockedWriter{mu: &sync.Mutex{}, w: w})), r
}

// NewCall returns a logger writing to stderr and to an in-memory trace.
// requestID, when non-empty, prefixes every line.
func NewCall(level boshlog.LogLevel, stderr io.Writer, requestID string) *Call {
	buf := &bytes.Buffer{}
	mu := &sync.Mutex{}
	r := &Redactor{}
	sink := r.Writer(&lockedWriter{mu: mu, w: io.MultiWriter(stderr, buf)})
	base := boshlog.NewWriterLogger(level, sink)
	var l Logger = base
	if requestID != "" {
		l = WithPrefix(base, "["+requestID+"] ")
	}
	return &Call{Logger: l, redactor: r, buf: buf, mu: mu}
}

// Redactor returns the call's redactor so callers can register secrets.
func (c *Call) Redactor() *Redactor { return c.redactor }

// Trace returns what was logged so far (already redacted).
func (c *Call) Trace() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.buf.String()
}

// Discard is a logger that writes nowhere, for tests and tools.
func Discard() Logger { return boshlog.NewWriterLogger(boshlog.LevelNone, io.Discard) }

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Fields logs a message followed by key=value pairs under one tag: the
// one call style, for a CPI call and the daemon alike.
type Fields struct {
	Logger
	Tag string
}

func (f Fields) Debug(msg string, kv ...any) { f.Logger.Debug(f.Tag, "%s", line(msg, kv)) }
func (f Fields) Info(msg string, kv ...any)  { f.Logger.Info(f.Tag, "%s", line(msg, kv)) }
func (f Fields) Warn(msg string, kv ...any)  { f.Logger.Warn(f.Tag, "%s", line(msg, kv)) }
func (f Fields) Error(msg string, kv ...any) { f.Logger.Error(f.Tag, "%s", line(msg, kv)) }

// line is msg then k=v for each pair; values with spaces, quotes or '='
// are quoted, so a line splits back into its fields.
func line(msg string, kv []any) string {
	var b strings.Builder
	b.WriteString(msg)
	for i := 0; i < len(kv); i += 2 {
		k, v := fmt.Sprint(kv[i]), "(missing)"
		if i+1 < len(kv) {
			v = fmt.Sprint(kv[i+1])
		}
		if v == "" || strings.ContainsAny(v, " \t\n\"=") {
			v = strconv.Quote(v)
		}
		b.WriteString(" " + k + "=" + v)
	}
	return b.String()
}

// WithPrefix wraps a logger so every message starts with prefix.
func WithPrefix(l Logger, prefix string) Logger { return &prefixed{Logger: l, prefix: prefix} }

type prefixed struct {
	Logger
	prefix string
}

func (p *prefixed) msg(m string, args []any) string {
	// Format here, then escape, because the wrapped logger formats again.
	return p.prefix + strings.ReplaceAll(fmt.Sprintf(m, args...), "%", "%%")
}
func (p *prefixed) Debug(tag, m string, a ...any) { p.Logger.Debug(tag, p.msg(m, a)) }
func (p *prefixed) Info(tag, m string, a ...any)  { p.Logger.Info(tag, p.msg(m, a)) }
func (p *prefixed) Warn(tag, m string, a ...any)  { p.Logger.Warn(tag, p.msg(m, a)) }
func (p *prefixed) Error(tag, m string, a ...any) { p.Logger.Error(tag, p.msg(m, a)) }
func (p *prefixed) DebugWithDetails(tag, m string, a ...any) {
	p.Logger.DebugWithDetails(tag, p.msg(m, a))
}
func (p *prefixed) ErrorWithDetails(tag, m string, a ...any) {
	p.Logger.ErrorWithDetails(tag, p.msg(m, a))
}

// Redactor replaces registered secret values in everything written through
// it. It is the last line of defence: code should not log secrets at all.
type Redactor struct {
	mu      sync.RWMutex
	secrets []string
}

// minSecretLen avoids redacting short common strings ("true", "1").
const minSecretLen = 6

// Add registers secret values.
func (r *Redactor) Add(values ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, v := range values {
		if len(v) >= minSecretLen {
			r.secrets = append(r.secrets, v)
		}
	}
}

// Redact returns s with every registered secret replaced, and every URL's
// user info and query values (RedactURLs).
func (r *Redactor) Redact(s string) string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	for _, sec := range r.secrets {
		s = strings.ReplaceAll(s, sec, "<redacted>")
	}
	return RedactURLs(s)
}

// urlRE finds URLs in free text: a scheme, "://", and what follows up to a
// space, quote or bracket. Compiled on first use: bin/cpi's start-up does
// not pay for it.
var urlRE = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`[A-Za-z][A-Za-z0-9+.-]*://[^\s"'<>()\[\]{},]+`)
})

// RedactURLs replaces the user info (user and password: a token is often
// the user) and each query value of every URL in s: credentials in
// auth_url, endpoints and DSNs never reach a message. A URL inside quoted
// text (Go's %q, a JSON string, a log value) keeps the backslash that
// escapes its closing quote, so the text still parses; an empty value is
// left empty, so text redacted twice reads as text redacted once.
func RedactURLs(s string) string {
	if !strings.Contains(s, "://") {
		return s
	}
	return urlRE().ReplaceAllStringFunc(s, func(raw string) string {
		trimmed := strings.TrimRight(raw, `\`)
		return redactURL(trimmed) + raw[len(trimmed):]
	})
}

// redactURL redacts one URL (as urlRE finds it).
func redactURL(raw string) string {
	scheme, rest, _ := strings.Cut(raw, "://")
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	if at := strings.LastIndex(rest[:end], "@"); at >= 0 {
		rest = "<redacted>" + rest[at:]
	}
	base, query, ok := strings.Cut(rest, "?")
	if !ok {
		return scheme + "://" + rest
	}
	query, frag, hasFrag := strings.Cut(query, "#")
	parts := strings.Split(query, "&")
	for i, p := range parts {
		if k, v, ok := strings.Cut(p, "="); ok && v != "" {
			parts[i] = k + "=<redacted>"
		}
	}
	out := scheme + "://" + base + "?" + strings.Join(parts, "&")
	if hasFrag {
		out += "#" + frag
	}
	return out
}

// Writer wraps w so every write is redacted first.
func (r *Redactor) Writer(w io.Writer) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		if _, err := io.WriteString(w, r.Redact(string(p))); err != nil {
			return 0, err
		}
		return len(p), nil
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

// secretWords: a key naming any of these, in any spelling (case, '-',
// '_', '.', camelCase), holds a secret: encryption_key, sshKey,
// private-key, X-Auth-Token, clientSecret, user_data, ...
var secretWords = []string{"key", "secret", "token", "password", "passwd", "credential", "passphrase", "userdata"}

// secretKey reports whether a map key names a secret. Erring towards
// redaction: a key pair's name or a KMS key's ARN are redacted too.
func secretKey(k string) bool {
	var b strings.Builder
	for _, r := range strings.ToLower(k) {
		if r != '_' && r != '-' && r != '.' && r != ' ' {
			b.WriteRune(r)
		}
	}
	norm := b.String()
	for _, w := range secretWords {
		if strings.Contains(norm, w) {
			return true
		}
	}
	return false
}

// IsSecretKey is exported for callers that redact structured data.
func IsSecretKey(k string) bool { return secretKey(k) }

// CollectSecrets walks a decoded JSON value and returns the string values
// stored under secret-looking keys (and everything below them).
func CollectSecrets(v any) []string {
	var out []string
	var walk func(v any, under bool)
	walk = func(v any, under bool) {
		switch t := v.(type) {
		case map[string]any:
			for k, x := range t {
				walk(x, under || secretKey(k))
			}
		case []any:
			for _, x := range t {
				walk(x, under)
			}
		case string:
			if under {
				out = append(out, t)
			}
		}
	}
	walk(v, false)
	return out
}

// Redacted returns a deep copy of v with secret-looking keys' values
// replaced by "<redacted>".
func Redacted(v any) any {
	switch t := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(t))
		for k, x := range t {
			if secretKey(k) {
				m[k] = "<redacted>"
			} else {
				m[k] = Redacted(x)
			}
		}
		return m
	case []any:
		s := make([]any, len(t))
		for i, x := range t {
			s[i] = Redacted(x)
		}
		return s
	case string:
		return RedactURLs(t)
	}
	return v
}
