// Package secret reads the daemon's secrets — forge tokens, webhook
// secrets, the admin token, the PostgreSQL DSN — from a file or the
// environment, never inline, and keeps each out of the log from the
// moment it is read.
package secret

import (
	"fmt"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/runway-cpi/runway/src/logging"
)

// Read reads a secret from a file (trimmed) or an environment variable
// ("" when neither is named) and adds it to redact.
func Read(file, env, what string, redact *logging.Redactor) (string, error) {
	s, err := read(file, env, what)
	redact.Add(s)
	return s, err
}

func read(file, env, what string) (string, error) {
	switch {
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			return "", fmt.Errorf("%s: %w", what, err)
		}
		s := strings.TrimSpace(string(b))
		if s == "" {
			return "", fmt.Errorf("%s: %s is empty", what, file)
		}
		return s, nil
	case env != "":
		s := strings.TrimSpace(os.Getenv(env))
		if s == "" {
			return "", fmt.Errorf("%s: environment variable %s is empty", what, env)
		}
		return s, nil
	}
	return "", nil
}

// Reloadable is a secret read from a file, read again whenever the file
// changes (size or modification time), so a rotated or fixed token needs
// no restart. A change that cannot be read, or is empty, keeps the last
// good value and is logged once. From the environment it is read once.
type Reloadable struct {
	file, what string
	redact     *logging.Redactor
	log        logging.Fields

	mu    sync.Mutex
	value string
	mod   time.Time
	size  int64
	bad   string // the last change that could not be used (logged once)
}

// New reads the secret now.
func New(file, env, what string, redact *logging.Redactor, log logging.Fields) (*Reloadable, error) {
	v, err := Read(file, env, what, redact)
	if err != nil {
		return nil, err
	}
	r := &Reloadable{file: file, what: what, redact: redact, log: log, value: v}
	if file != "" {
		if fi, err := os.Stat(file); err == nil {
			r.mod, r.size = fi.ModTime(), fi.Size()
		}
	}
	return r, nil
}

// Get is the current value (one stat per call when it comes from a file).
func (r *Reloadable) Get() string {
	if r == nil {
		return ""
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.file == "" {
		return r.value
	}
	fi, err := os.Stat(r.file)
	if err != nil || fi.ModTime().Equal(r.mod) && fi.Size() == r.size {
		return r.value
	}
	v, err := Read(r.file, "", r.what, r.redact)
	if err != nil {
		if msg := err.Error(); msg != r.bad {
			r.bad = msg
			r.log.Warn("secret file changed but cannot be used; keeping the previous value", "what", r.what, "err", msg)
		}
		return r.value
	}
	r.mod, r.size, r.bad = fi.ModTime(), fi.Size(), ""
	if v != r.value {
		r.value = v
		r.log.Info("secret file changed: using the new value", "what", r.what)
	}
	return r.value
}
