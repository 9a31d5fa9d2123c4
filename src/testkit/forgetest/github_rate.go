package forgetest

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"
)

// GitHub's primary rate limit as its REST documentation describes it: a
// budget of requests per window per token (5,000 an hour for a user),
// every answer carrying X-RateLimit-Limit, -Remaining, -Used, -Reset
// (epoch seconds) and -Resource; past the budget, 403 "API rate limit
// exceeded" until the reset. A conditional GET answered 304 (its
// If-None-Match matching the ETag, a hash of the body here) costs
// nothing, and is answered even past the budget.
type rateLimit struct {
	limit    int
	window   time.Duration
	used     int
	resetAt  time.Time
	refused  int
	notMod   int
	maxUsage int
}

// SetRateLimit sets the budget: limit requests per window (0: none).
func (g *GitHub) SetRateLimit(limit int, window time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.rate = rateLimit{limit: limit, window: window}
}

// RateUsage reports the most requests used in one window, how many were
// refused for the rate limit, and how many were answered 304.
func (g *GitHub) RateUsage() (maxUsed, refused, notModified int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.rate.maxUsage, g.rate.refused, g.rate.notMod
}

// metered serves an authenticated API request inside the rate limit.
func (g *GitHub) metered(w http.ResponseWriter, r *http.Request, serve http.HandlerFunc) {
	rec := httptest.NewRecorder()
	if r.Method == http.MethodGet {
		serve(rec, r)
	}
	etag := ""
	if r.Method == http.MethodGet && rec.Code == http.StatusOK {
		sum := sha256.Sum256(rec.Body.Bytes())
		etag = `W/"` + hex.EncodeToString(sum[:16]) + `"`
	}
	g.mu.Lock()
	rl := &g.rate
	now := time.Now()
	if rl.resetAt.IsZero() || !now.Before(rl.resetAt) {
		rl.used, rl.resetAt = 0, now.Add(max(rl.window, time.Second))
	}
	notModified := etag != "" && r.Header.Get("If-None-Match") == etag
	refuse := !notModified && rl.limit > 0 && rl.used >= rl.limit
	switch {
	case notModified:
		rl.notMod++
	case refuse:
		rl.refused++
	default:
		rl.used++
		rl.maxUsage = max(rl.maxUsage, rl.used)
	}
	h := w.Header()
	if rl.limit > 0 {
		h.Set("X-RateLimit-Limit", strconv.Itoa(rl.limit))
		h.Set("X-RateLimit-Remaining", strconv.Itoa(max(rl.limit-rl.used, 0)))
		h.Set("X-RateLimit-Used", strconv.Itoa(rl.used))
		h.Set("X-RateLimit-Reset", strconv.FormatInt(rl.resetAt.Unix(), 10))
		h.Set("X-RateLimit-Resource", "core")
	}
	g.mu.Unlock()
	switch {
	case notModified:
		h.Set("ETag", etag)
		w.WriteHeader(http.StatusNotModified)
	case refuse:
		writeJSON(w, http.StatusForbidden, map[string]string{"message": "API rate limit exceeded for user ID 1.",
			"documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"})
	case r.Method != http.MethodGet:
		serve(w, r)
	default:
		for k, v := range rec.Header() {
			h[k] = v
		}
		if etag != "" {
			h.Set("ETag", etag)
		}
		w.WriteHeader(rec.Code)
		fmt.Fprint(w, rec.Body.String())
	}
}
