package orchestrator

import (
	"testing"
	"time"
)

// Timings are nearest-rank percentiles of the last hour's durations, per
// group and kind; older ones are dropped.
func TestTimingsPercentiles(t *testing.T) {
	var h History
	now := time.Now()
	h.RecordDuration("g", JobQueue, now.Add(-2*time.Hour), time.Hour) // outside the hour
	for i := 1; i <= 100; i++ {
		h.RecordDuration("g", JobQueue, now, time.Duration(i)*time.Millisecond)
	}
	h.RecordDuration("g", JobRun, now, 3*time.Second)
	got := map[string]Timing{}
	for _, tm := range h.Timings("g") {
		got[tm.Kind] = tm
	}
	q := got[JobQueue]
	if q.Count != 100 || q.P50 != 50*time.Millisecond || q.P90 != 90*time.Millisecond || q.P99 != 99*time.Millisecond {
		t.Errorf("job queue: %+v", q)
	}
	if r := got[JobRun]; r.Count != 1 || r.P50 != 3*time.Second || r.P99 != 3*time.Second {
		t.Errorf("job run: %+v", r)
	}
	if s := got[RunnerStartup]; s.Count != 0 {
		t.Errorf("runner start-up: %+v", s)
	}
	if other := h.Timings("other"); len(other) != 3 || other[0].Count != 0 {
		t.Errorf("another group: %+v", other)
	}
}
