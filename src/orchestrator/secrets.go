package orchestrator

import (
	"os"
	"sync"
	"time"
)

// reloadable is a token or secret read from a file, read again whenever
// the file changes (size or modification time), so a rotated or fixed
// token needs no restart. A change that cannot be read, or is empty,
// keeps the last good value and is logged once. From the environment it
// is read once.
type reloadable struct {
	o          *Orchestrator
	file, what string

	mu    sync.Mutex
	value string
	mod   time.Time
	size  int64
	bad   string // the last change that could not be used (logged once)
}

func (o *Orchestrator) reloadable(file, env, what string) (*reloadable, error) {
	v, err := o.secret(file, env, what)
	if err != nil {
		return nil, err
	}
	r := &reloadable{o: o, file: file, what: what, value: v}
	if file != "" {
		if fi, err := os.Stat(file); err == nil {
			r.mod, r.size = fi.ModTime(), fi.Size()
		}
	}
	return r, nil
}

// get is the current value (one stat per call when it comes from a file).
func (r *reloadable) get() string {
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
	v, err := r.o.secret(r.file, "", r.what)
	if err != nil {
		if msg := err.Error(); msg != r.bad {
			r.bad = msg
			r.o.log.Warn("secret file changed but cannot be used; keeping the previous value", "what", r.what, "err", msg)
		}
		return r.value
	}
	r.mod, r.size, r.bad = fi.ModTime(), fi.Size(), ""
	if v != r.value {
		r.value = v
		r.o.log.Info("secret file changed: using the new value", "what", r.what)
	}
	return r.value
}
