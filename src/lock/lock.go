// Package lock provides named cross-process locks on gofrs/flock. Each CPI
// call is its own process, so in-process mutexes protect nothing.
package lock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gofrs/flock"

	"github.com/runway-cpi/runway/src/logging"
)

// DefaultTimeout bounds how long a call waits for a lock.
const DefaultTimeout = 2 * time.Minute

// ErrTimeout is returned when a lock could not be had within the timeout.
var ErrTimeout = errors.New("lock: timed out")

func validName(s string) bool { return len(s) <= 200 && SafeName(s) }

// SafeName reports whether s can be used as one path component: letters,
// digits, '.', '_', '-', not empty and not starting with '.'. A loop, not a
// regexp: bin/cpi pays package init time on every call.
func SafeName(s string) bool {
	if s == "" || s[0] == '.' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Locker hands out locks stored as files in one directory.
type Locker struct {
	Dir     string
	Timeout time.Duration
	Logger  logging.Logger
	// SlowAfter: waits longer than this are logged at info level.
	SlowAfter time.Duration
}

// log is the locker's logger, tag "lock".
func (l *Locker) log() logging.Fields { return logging.Fields{Logger: l.Logger, Tag: "lock"} }

// New creates the lock directory if needed.
func New(dir string, timeout time.Duration, logger logging.Logger) (*Locker, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("lock: creating %s: %w", dir, err)
	}
	if timeout <= 0 {
		timeout = DefaultTimeout
	}
	if logger == nil {
		logger = logging.Discard()
	}
	return &Locker{Dir: dir, Timeout: timeout, Logger: logger, SlowAfter: 10 * time.Millisecond}, nil
}

// Lock takes the exclusive lock called name (e.g. "vm-<cid>"), waiting at
// most the locker's timeout. The returned function releases it.
func (l *Locker) Lock(ctx context.Context, name string) (func(), error) {
	if !validName(name) {
		return nil, fmt.Errorf("lock: invalid lock name %q", name)
	}
	path := l.path(name)
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, l.Timeout)
	defer cancel()
	for logged := false; ; {
		fl := flock.New(path)
		ok, err := fl.TryLock()
		if err == nil && !ok {
			if !logged {
				l.log().Debug("waiting for lock", "lock", name)
				logged = true
			}
			ok, err = fl.TryLockContext(cctx, pollInterval(l.Timeout))
			if err != nil && errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				return nil, fmt.Errorf("%w after %s waiting for %s", ErrTimeout, l.Timeout, name)
			}
		}
		if err != nil {
			return nil, fmt.Errorf("lock %s: %w", name, err)
		}
		if !ok {
			return nil, fmt.Errorf("%w waiting for %s", ErrTimeout, name)
		}
		// The holder we waited for may have pruned the file: a lock on a
		// file nobody will open again excludes no one. Try the new one.
		if !current(fl, path) {
			_ = fl.Close()
			continue
		}
		if waited := time.Since(start); waited > l.SlowAfter {
			l.log().Info("acquired lock after waiting", "lock", name, "waited", waited.Round(time.Millisecond))
		}
		return func() { _ = fl.Unlock() }, nil
	}
}

// TryLock takes lock name only if it is free now. A sweeper uses it to
// prove that whoever made a half-built resource is gone: creators hold the
// resource's lock from start to finish, and the kernel drops it when they
// die.
func (l *Locker) TryLock(name string) (release func(), ok bool, err error) {
	if !validName(name) {
		return nil, false, fmt.Errorf("lock: invalid lock name %q", name)
	}
	path := l.path(name)
	for {
		fl := flock.New(path)
		ok, err := fl.TryLock()
		if err != nil || !ok {
			return nil, false, err
		}
		if current(fl, path) {
			return func() { _ = fl.Unlock() }, true, nil
		}
		_ = fl.Close()
	}
}

func (l *Locker) path(name string) string { return filepath.Join(l.Dir, name+".lock") }

// current reports whether the locked descriptor is still the file at path.
func current(fl *flock.Flock, path string) bool {
	held, err := fl.Stat()
	if err != nil {
		return false
	}
	now, err := os.Stat(path)
	return err == nil && os.SameFile(held, now)
}

// Prune removes the file of lock name, which the caller must hold, so that
// lock files of resources that are gone do not pile up. Waiters notice and
// lock the next file instead.
func (l *Locker) Prune(name string) {
	if validName(name) {
		_ = os.Remove(l.path(name))
	}
}

// Release releases name, pruning its file first when the resource it
// guards turned out to be gone (or never to have existed).
func (l *Locker) Release(name string, release func(), gone bool) {
	if gone {
		l.Prune(name)
	}
	release()
}

// Forget prunes lock name for a resource that is gone: it takes the lock
// (so no holder is cut off) and removes its file. A lock with no file is
// left alone, so forgetting creates nothing.
func (l *Locker) Forget(ctx context.Context, name string) error {
	if !validName(name) {
		return fmt.Errorf("lock: invalid lock name %q", name)
	}
	if _, err := os.Stat(l.path(name)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	release, err := l.Lock(ctx, name)
	if err != nil {
		return err
	}
	l.Prune(name)
	release()
	return nil
}

func pollInterval(timeout time.Duration) time.Duration {
	// flock has no blocking-with-timeout; poll often enough that a released
	// lock is picked up quickly, rarely enough not to spin.
	if d := timeout / 1000; d > 2*time.Millisecond {
		if d > 50*time.Millisecond {
			return 50 * time.Millisecond
		}
		return d
	}
	return 2 * time.Millisecond
}
