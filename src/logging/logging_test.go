package logging

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"

	boshlog "github.com/cloudfoundry/bosh-utils/logger"

	"github.com/runway-cpi/runway/src/config"
)

func TestTraceAndStderrGetTheSameRedactedLines(t *testing.T) {
	var stderr bytes.Buffer
	c := NewCall(boshlog.LevelDebug, &stderr, "cpi-42")
	c.Redactor().Add("hunter2-canary", "ab") // too short: ignored
	c.Info("cpi", "password is %s and %s", "hunter2-canary", "ab")
	c.Debug("local", "100%% done")
	trace := c.Trace()
	if trace != stderr.String() {
		t.Fatalf("trace %q differs from stderr %q", trace, stderr.String())
	}
	if strings.Contains(trace, "hunter2-canary") || !strings.Contains(trace, "<redacted>") {
		t.Fatalf("secret not redacted: %q", trace)
	}
	for _, line := range strings.Split(strings.TrimSpace(trace), "\n") {
		if !strings.Contains(line, "[cpi-42] ") {
			t.Errorf("line without request id: %q", line)
		}
	}
	if !strings.Contains(trace, "100% done") || !strings.Contains(trace, "and ab") {
		t.Errorf("formatting mangled: %q", trace)
	}
}

func TestLevelOverride(t *testing.T) {
	t.Setenv(EnvLevel, "debug")
	if l, err := ParseLevel("error"); err != nil || l != boshlog.LevelDebug {
		t.Fatalf("env override: %v %v", l, err)
	}
	t.Setenv(EnvLevel, "")
	t.Setenv("BOSH_LOG_LEVEL", "")
	if l, _ := ParseLevel(""); l != boshlog.LevelInfo {
		t.Fatalf("default level %v", l)
	}
	if _, err := ParseLevel("chatty"); err == nil {
		t.Fatal("bad level accepted")
	}
}

func TestCollectAndRedact(t *testing.T) {
	v := map[string]any{
		"bosh":      map[string]any{"password": "pw-hash-123", "keep": "visible"},
		"openstack": map[string]any{"api_key": "os-key-9999", "auth_url": "http://x"},
		"runner":    map[string]any{"registration_token": map[string]any{"value": "tok-abcdef"}},
		"list":      []any{map[string]any{"secret_access_key": "aws-secret-1"}},
	}
	got := strings.Join(CollectSecrets(v), ",")
	for _, s := range []string{"pw-hash-123", "os-key-9999", "tok-abcdef", "aws-secret-1"} {
		if !strings.Contains(got, s) {
			t.Errorf("secret %s not collected: %s", s, got)
		}
	}
	if strings.Contains(got, "visible") || strings.Contains(got, "http://x") {
		t.Errorf("non-secret collected: %s", got)
	}
	r := Redacted(v).(map[string]any)
	if r["bosh"].(map[string]any)["password"] != "<redacted>" || r["bosh"].(map[string]any)["keep"] != "visible" {
		t.Errorf("redacted = %v", r)
	}
	if v["bosh"].(map[string]any)["password"] != "pw-hash-123" {
		t.Error("Redacted modified its input")
	}
}

func TestSecretKeysInAnySpelling(t *testing.T) {
	for _, k := range []string{"password", "PASSWORD", "db_password", "passwd", "encryption_key", "sshKey", "private-key", "privateKey",
		"private_key", "apiKey", "api_key", "secret_access_key", "clientSecret", "client-secret", "auth_token", "X-Auth-Token",
		"Credentials", "application_credential_secret", "user-data", "userData", "user_data", "PassPhrase", "tls.key"} {
		if !IsSecretKey(k) {
			t.Errorf("%q is not taken for a secret", k)
		}
	}
	for _, k := range []string{"name", "region", "instance_type", "agent_id", "director_uuid", "ram", "stemcell_cid", "auth_url", "username"} {
		if IsSecretKey(k) {
			t.Errorf("%q is taken for a secret", k)
		}
	}
}

func TestDaemonLoggerFieldsAndRedaction(t *testing.T) {
	var out bytes.Buffer
	l, r := New(boshlog.LevelInfo, &out)
	r.Add("forge-token-123")
	f := Fields{Logger: l, Tag: "orchestrator"}
	f.Debug("hidden at info")
	f.Info("runner created", "group", "linux", "err", errors.New("bad token forge-token-123 here"), "empty", "", "odd")
	got := out.String()
	for _, want := range []string{"[orchestrator]", "INFO - runner created group=linux", `err="bad token <redacted> here"`, `empty=""`, "odd=(missing)"} {
		if !strings.Contains(got, want) {
			t.Errorf("log %q lacks %q", got, want)
		}
	}
	if strings.Contains(got, "hidden") || strings.Contains(got, "forge-token-123") {
		t.Errorf("log %q", got)
	}
	if _, err := Level("loud"); err == nil || !strings.Contains(err.Error(), "debug, info, warn, error or none") {
		t.Errorf("Level(loud) = %v", err)
	}
}

func TestRedactURLs(t *testing.T) {
	for in, want := range map[string]string{
		`auth_url "http://admin:PW-1234@keystone:5000/v3": refused`: `auth_url "http://<redacted>@keystone:5000/v3": refused`,
		`get https://ghp_T0KEN@github.com/o/r.git failed`:           `get https://<redacted>@github.com/o/r.git failed`,
		`Post "http://h/api?token=abc123&page=2#top": EOF`:          `Post "http://h/api?token=<redacted>&page=<redacted>#top": EOF`,
		`postgres://runway:s3cret@db:5432/runway?sslmode=disable`:   `postgres://<redacted>@db:5432/runway?sslmode=<redacted>`,
		`no url here: a@b, x=y`:                                     `no url here: a@b, x=y`,
		`plain http://127.0.0.1:9/v3 stays`:                         `plain http://127.0.0.1:9/v3 stays`,
		`path@ "http://host/a@b" keeps a path's @`:                  `path@ "http://host/a@b" keeps a path's @`,
	} {
		if got := RedactURLs(in); got != want {
			t.Errorf("RedactURLs(%q) = %q, want %q", in, got, want)
		}
	}
	var r Redactor
	if got := r.Redact(`dial nats://nats:natspw@10.0.0.6:4222`); got != `dial nats://<redacted>@10.0.0.6:4222` {
		t.Errorf("Redact = %q", got)
	}
	if got := Redacted(map[string]any{"mbus": "https://mbus:pw@0.0.0.0:6868"}); got.(map[string]any)["mbus"] != "https://<redacted>@0.0.0.0:6868" {
		t.Errorf("Redacted = %v", got)
	}
}

// Every level the config accepts is one the logger takes.
func TestConfigLevelsAreLoggerLevels(t *testing.T) {
	for _, l := range config.LogLevels {
		for _, s := range []string{l, strings.ToUpper(l)} {
			if _, err := Level(s); err != nil {
				t.Errorf("config takes log_level %q, the logger does not: %v", s, err)
			}
		}
	}
}

// A URL inside quoted text — a log value, a JSON string — is redacted
// and the text still parses: the backslash escaping the closing quote
// stays. And text redacted twice reads as text redacted once.
func TestRedactURLsInQuotedText(t *testing.T) {
	const msg = `Get "http://canary-user:canary-pass@gitea.example:3000/keep/this?token=canary-query&page=2": EOF`
	const want = `Get "http://<redacted>@gitea.example:3000/keep/this?token=<redacted>&page=<redacted>": EOF`
	var out bytes.Buffer
	l, _ := New(boshlog.LevelInfo, &out)
	Fields{Logger: l, Tag: "orchestrator"}.Warn("reconcile failed", "err", errors.New(msg), "group", "linux")
	line := out.String()
	_, v, _ := strings.Cut(line, " err=")
	quoted, rest, err := cutQuoted(v)
	if got, uerr := strconv.Unquote(quoted); err != nil || uerr != nil || got != want || strings.TrimSpace(rest) != "group=linux" {
		t.Errorf("log line %q: err value %q (%v, %v), rest %q; want %q then group=linux", line, got, err, uerr, rest, want)
	}
	var js bytes.Buffer
	enc := json.NewEncoder(&js)
	enc.SetEscapeHTML(false) // as the daemon's API writes
	enc.Encode(map[string]string{"last_error": msg})
	b := js.Bytes()
	var back map[string]string
	if err := json.Unmarshal([]byte(RedactURLs(string(b))), &back); err != nil || back["last_error"] != want {
		t.Errorf("JSON %s redacted: %q (%v); want %q", b, back["last_error"], err, want)
	}
	for _, s := range []string{msg, line, string(b), `see http://h/p?token=&x=1 and https://a:b@c/d`} {
		once := RedactURLs(s)
		if twice := RedactURLs(once); twice != once {
			t.Errorf("redacted twice %q, once %q", twice, once)
		}
	}
}

// cutQuoted splits a Go-quoted string off the front of s.
func cutQuoted(s string) (string, string, error) {
	for i := 1; i < len(s); i++ {
		if s[i] == '\\' {
			i++
			continue
		}
		if s[i] == '"' {
			return s[:i+1], s[i+1:], nil
		}
	}
	return "", s, errors.New("no closing quote")
}
