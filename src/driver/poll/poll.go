// Package poll is how cloud drivers wait for a resource to reach a
// state: polling at growing intervals, within a configured bound.
package poll

import (
	"context"
	"fmt"
	"time"
)

// Polling is the config every cloud driver has for waiting on a state:
// `poll_max_ms` and `wait_timeout_seconds` (embedded in its config).
type Polling struct {
	// PollMaxMilli caps the interval between state checks (default 2000).
	PollMaxMilli int `json:"poll_max_ms,omitempty"`
	// WaitTimeoutSeconds bounds each wait for a state (default 900).
	WaitTimeoutSeconds int `json:"wait_timeout_seconds,omitempty"`
}

// Polling defaults.
const (
	DefaultPollMax     = 2 * time.Second
	DefaultWaitTimeout = 15 * time.Minute
)

// PollMax is the configured cap, or the default.
func (p Polling) PollMax() time.Duration {
	if p.PollMaxMilli > 0 {
		return time.Duration(p.PollMaxMilli) * time.Millisecond
	}
	return DefaultPollMax
}

// WaitTimeout is the configured bound, or the default.
func (p Polling) WaitTimeout() time.Duration {
	if p.WaitTimeoutSeconds > 0 {
		return time.Duration(p.WaitTimeoutSeconds) * time.Second
	}
	return DefaultWaitTimeout
}

// Poll is how a driver waits: the first interval, how it grows (Factor,
// in tenths: 15 is ×1.5), and whether to check before the first sleep
// (worth it where a state is often reached at once).
type Poll struct {
	// Name prefixes the time-out error ("openstack").
	Name       string
	First      time.Duration
	Factor     int
	CheckFirst bool
}

// WaitFor polls check until it reports done, growing the interval up to
// the config's cap, for at most its timeout. log (a logging.Fields
// method) gets one line when a wait ends.
func (p Polling) WaitFor(ctx context.Context, how Poll, what string, log func(msg string, kv ...any), check func(ctx context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, p.WaitTimeout())
	defer cancel()
	start := time.Now()
	interval := how.First
	for polls := 0; ; polls++ {
		if polls > 0 || !how.CheckFirst {
			t := time.NewTimer(interval)
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("%s: timed out after %s waiting for %s: %w", how.Name, time.Since(start).Round(time.Millisecond), what, ctx.Err())
			case <-t.C:
			}
			interval = min(interval*time.Duration(how.Factor)/10, p.PollMax())
		}
		done, err := check(ctx)
		if err != nil {
			return err
		}
		if done {
			if log != nil && (polls > 0 || !how.CheckFirst) {
				log("waited", "for", what, "took", time.Since(start).Round(time.Millisecond), "polls", polls+1)
			}
			return nil
		}
	}
}
