package forge

import (
	"net/http"
	"strconv"
	"sync"
	"time"
)

// RateBudget is a forge's rate limit as its answers state it
// (X-RateLimit-Limit, -Remaining, -Reset: GitHub's headers; Gitea sends
// none, and then nothing is ever low).
type RateBudget struct {
	mu        sync.Mutex
	limit     int
	remaining int
	reset     time.Time
}

// Observe reads one answer's rate-limit headers.
func (b *RateBudget) Observe(h http.Header) {
	limit, err1 := strconv.Atoi(h.Get("X-RateLimit-Limit"))
	rem, err2 := strconv.Atoi(h.Get("X-RateLimit-Remaining"))
	reset, err3 := strconv.ParseInt(h.Get("X-RateLimit-Reset"), 10, 64)
	if err1 != nil || err2 != nil || err3 != nil || limit <= 0 {
		return
	}
	b.mu.Lock()
	b.limit, b.remaining, b.reset = limit, rem, time.Unix(reset, 0)
	b.mu.Unlock()
}

// Low reports whether less than share of the budget is left before its
// reset (and when that is): polling waits then, so what is left serves
// the calls that make and remove runners.
func (b *RateBudget) Low(share float64, now time.Time) (bool, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.limit == 0 || !now.Before(b.reset) {
		return false, time.Time{}
	}
	return float64(b.remaining) < share*float64(b.limit), b.reset
}
