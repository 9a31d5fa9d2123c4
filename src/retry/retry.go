// Package retry runs an operation with full-jitter exponential backoff,
// honouring Retry-After, inside a total wait budget. Classification is
// pluggable so each IaaS driver says what a throttle looks like.
package retry

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// Class says what to do with an error.
type Class int

const (
	Permanent Class = iota // give up at once
	Transient              // retry with backoff
	Throttle               // rate limited: retry, honouring RetryAfter
)

func (c Class) String() string {
	return [...]string{"permanent", "transient", "throttled"}[c]
}

// Verdict is a classifier's answer.
type Verdict struct {
	Class      Class
	RetryAfter time.Duration // from the server, 0 when not given
}

// Classifier inspects an error.
type Classifier func(error) Verdict

// Policy configures retries. The zero value is not useful; use Default.
type Policy struct {
	Base     time.Duration // first backoff ceiling
	MaxSleep time.Duration // cap per sleep (without Retry-After)
	Budget   time.Duration // total time spent waiting
	// MaxFaults, when > 0, bounds the transient faults (5xx, resets,
	// timeouts) one call sits out; throttles are bounded by Budget only:
	// a rate limit is waited out, never turned into a failure early.
	MaxFaults int
	Classify  Classifier
	// Log receives one line per wait (a message, then key-value pairs, as
	// logging.Fields takes them). May be nil.
	Log func(msg string, kv ...any)
	// Sleep waits; replaced in tests. Must return ctx.Err() when cancelled.
	Sleep func(ctx context.Context, d time.Duration) error
	// Rand returns a value in [0,1); replaced in tests.
	Rand func() float64
}

// Default returns a policy with sane defaults: 250 ms base, 30 s cap,
// 10 min budget, nothing retried until a classifier says so.
func Default() Policy {
	return Policy{Base: 250 * time.Millisecond, MaxSleep: 30 * time.Second, Budget: 10 * time.Minute}
}

// For is p (Default when p has no budget) classifying with c and logging
// its waits to log unless p already logs somewhere: what a driver builds
// from the CPI's retry config.
func (p Policy) For(c Classifier, log func(msg string, kv ...any)) Policy {
	if p.Budget <= 0 {
		p = Default()
	}
	p.Classify = c
	if p.Log == nil {
		p.Log = log
	}
	return p
}

// ErrBudgetExhausted wraps the last error when the wait budget is spent.
var ErrBudgetExhausted = errors.New("retry budget exhausted")

// BudgetError reports giving up; it unwraps to the last operation error.
type BudgetError struct {
	Op       string
	Attempts int
	Waited   time.Duration
	Last     error
}

func (e *BudgetError) Error() string {
	return fmt.Sprintf("%s: gave up after %d attempts and %s of waiting: %v", e.Op, e.Attempts, e.Waited.Round(time.Millisecond), e.Last)
}
func (e *BudgetError) Unwrap() []error { return []error{ErrBudgetExhausted, e.Last} }

// Do runs fn until it succeeds, fails permanently, or the budget is spent.
func (p Policy) Do(ctx context.Context, op string, fn func(context.Context) error) error {
	sleep, rnd := p.Sleep, p.Rand
	if sleep == nil {
		sleep = SleepContext
	}
	if rnd == nil {
		rnd = rand.Float64
	}
	var waited time.Duration
	faults := 0
	for attempt := 1; ; attempt++ {
		err := fn(ctx)
		if err == nil {
			return nil
		}
		v := Verdict{Class: Permanent}
		if p.Classify != nil {
			v = p.Classify(err)
		}
		if v.Class == Permanent || ctx.Err() != nil {
			return err
		}
		if v.Class == Transient {
			if faults++; p.MaxFaults > 0 && faults >= p.MaxFaults {
				return &BudgetError{Op: op, Attempts: attempt, Waited: waited, Last: err}
			}
		}
		d := p.backoff(attempt, rnd)
		if v.RetryAfter > 0 {
			// The server knows best; add a little jitter so a fleet of
			// throttled processes does not return in lockstep.
			d = v.RetryAfter + time.Duration(rnd()*float64(p.Base))
		}
		remaining := p.Budget - waited
		if remaining <= 0 || (v.RetryAfter > 0 && v.RetryAfter > remaining) {
			return &BudgetError{Op: op, Attempts: attempt, Waited: waited, Last: err}
		}
		if d > remaining {
			d = remaining
		}
		if p.Log != nil {
			p.Log("waiting to retry", "op", op, "class", v.Class, "attempt", attempt, "err", err,
				"wait", d.Round(time.Millisecond), "waited", waited.Round(time.Millisecond), "budget", p.Budget)
		}
		if serr := sleep(ctx, d); serr != nil {
			return fmt.Errorf("%s: %w while waiting to retry (last error: %v)", op, serr, err)
		}
		waited += d
	}
}

// backoff is "full jitter": uniform in [0, min(cap, base*2^(attempt-1))].
func (p Policy) backoff(attempt int, rnd func() float64) time.Duration {
	ceil := p.Base
	for i := 1; i < attempt && ceil < p.MaxSleep; i++ {
		ceil *= 2
	}
	if p.MaxSleep > 0 && ceil > p.MaxSleep {
		ceil = p.MaxSleep
	}
	return time.Duration(rnd() * float64(ceil))
}

// SleepContext sleeps for d or until ctx is done.
func SleepContext(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ParseRetryAfter reads an HTTP Retry-After value (seconds or HTTP date).
func ParseRetryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	var secs int
	if _, err := fmt.Sscanf(v, "%d", &secs); err == nil && fmt.Sprint(secs) == v {
		if secs < 0 {
			return 0
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := time.Parse(time.RFC1123, v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}
