package orchestrator

import (
	"math"
	"slices"
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
	// durations: per group and kind, the durations of the last hour.
	durations map[string]map[string][]timed
}

type timed struct {
	at time.Time
	d  time.Duration
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
	// maxDurations bounds each kind's samples (a 1,000-job burst fits).
	maxDurations = 10000
)

// The durations kept, as the status page names them.
const (
	JobQueue      = "job queue"
	RunnerStartup = "runner start-up"
	JobRun        = "job run"
)

// Timing is one kind of duration over the last hour.
type Timing struct {
	Kind          string
	Count         int
	P50, P90, P99 time.Duration
}

// RecordDuration keeps one duration of a kind for a group.
func (h *History) RecordDuration(group, kind string, at time.Time, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.durations == nil {
		h.durations = map[string]map[string][]timed{}
	}
	if h.durations[group] == nil {
		h.durations[group] = map[string][]timed{}
	}
	s := append(h.durations[group][kind], timed{at, d})
	cut := 0
	for cut < len(s) && (at.Sub(s[cut].at) > HistorySpan || len(s)-cut > maxDurations) {
		cut++
	}
	h.durations[group][kind] = s[cut:]
}

// Timings are a group's job queue, runner start-up and job run times of
// the last hour: how many, and their median, 90th and 99th percentiles
// (nearest rank).
func (h *History) Timings(group string) []Timing {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []Timing
	for _, kind := range []string{JobQueue, RunnerStartup, JobRun} {
		s := h.durations[group][kind]
		ds := make([]time.Duration, len(s))
		for i, x := range s {
			ds[i] = x.d
		}
		slices.Sort(ds)
		t := Timing{Kind: kind, Count: len(ds)}
		if len(ds) > 0 {
			rank := func(q float64) time.Duration { return ds[int(math.Ceil(q*float64(len(ds))))-1] }
			t.P50, t.P90, t.P99 = rank(0.5), rank(0.9), rank(0.99)
		}
		out = append(out, t)
	}
	return out
}

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
