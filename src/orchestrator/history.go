package orchestrator

import (
	"sort"
	"sync"
	"time"

	"github.com/runway-cpi/runway/src/clip"
)

// History keeps what the status page shows beyond the current state: per
// group, queued jobs and runners at each pass of the last hour; and the
// most recent CPI and forge errors.
type History struct {
	mu      sync.Mutex
	samples map[string][]Sample
	errs    []RecentError
}

// Sample is one pass's counts.
type Sample struct {
	At              time.Time
	Queued, Runners int
}

// RecentError is an error kept for the page (redacted, clipped).
type RecentError struct {
	At          time.Time
	Group, Kind string
	Message     string
}

const (
	// HistorySpan is how far back samples are kept.
	HistorySpan = time.Hour
	maxSamples  = 3600
	maxErrors   = 20
)

// Record adds a group's counts at a pass.
func (h *History) Record(group string, at time.Time, queued, runners int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.samples == nil {
		h.samples = map[string][]Sample{}
	}
	s := append(h.samples[group], Sample{at, queued, runners})
	cut := 0
	for cut < len(s) && (at.Sub(s[cut].At) > HistorySpan || len(s)-cut > maxSamples) {
		cut++
	}
	h.samples[group] = s[cut:]
}

// Samples are a group's samples of the last hour, oldest first.
func (h *History) Samples(group string) []Sample {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Sample(nil), h.samples[group]...)
}

// Errors are the recent errors, newest first.
func (h *History) Errors() []RecentError {
	h.mu.Lock()
	out := append([]RecentError(nil), h.errs...)
	h.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].At.After(out[j].At) })
	return out
}

func (h *History) addError(e RecentError) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.errs = append(h.errs, e)
	if len(h.errs) > maxErrors {
		h.errs = h.errs[len(h.errs)-maxErrors:]
	}
}

// History is what the status page shows of the last hour.
func (o *Orchestrator) History() *History { return &o.hist }

// Failure keeps an error for the status page (redacted, clipped).
func (o *Orchestrator) Failure(group, kind string, err error) {
	if err == nil {
		return
	}
	o.hist.addError(RecentError{At: o.now(), Group: group, Kind: kind, Message: clip.To(o.redact.Redact(err.Error()), 500)})
}
