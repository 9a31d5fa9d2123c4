package orchestrator

import (
	"time"

	"github.com/runway-cpi/runway/src/forge"
)

// observe records one duration of a kind for the group: its Prometheus
// histogram and the status page's last hour.
func (g *group) observe(kind string, d time.Duration) {
	if d < 0 {
		return // a clock step: no duration to report
	}
	h := g.dep.metrics.jobRun
	switch kind {
	case JobQueue:
		h = g.dep.metrics.jobQueue
	case RunnerStartup:
		h = g.dep.metrics.runnerStartup
	}
	h.WithLabelValues(g.cfg().Name).Observe(d.Seconds())
	g.dep.hist.RecordDuration(g.cfg().Name, kind, g.dep.now(), d)
}

// observeJob records a job's queue time (created → started) and run time
// (started → completed) from the forge's own dates, once each, for the
// group whose runner ran it: from a delivery, a listing or a job fetched
// again. (Forges date to the second.)
func (o *Orchestrator) observeJob(j forge.Job) { o.observeJobFrom(j, false) }

// observeJobFrom records a job's times from the forge (a delivery, a
// listing) or from a scale set's messages (fromScaleSet): a scale-set
// group's jobs are timed from its messages only (the forge's deliveries
// of the same jobs name them by another id).
func (o *Orchestrator) observeJobFrom(j forge.Job, fromScaleSet bool) {
	if o.store == nil || j.RunnerName == "" || j.StartedAt.IsZero() || j.Status == forge.StatusQueued || j.Status == forge.StatusWaiting {
		return
	}
	o.timedMu.Lock()
	if o.timed == nil || len(o.timed) > maxTimedJobs {
		o.timed = map[int64]uint8{} // forget the oldest wholesale: at worst a job counted twice
	}
	f := o.timed[j.ID]
	queue := f&1 == 0 && !j.CreatedAt.IsZero()
	run := f&2 == 0 && j.Status == forge.StatusCompleted && !j.CompletedAt.IsZero()
	if queue {
		f |= 1
	}
	if run {
		f |= 2
	}
	o.timed[j.ID] = f
	o.timedMu.Unlock()
	if !queue && !run {
		return
	}
	r, err := o.store.Get(j.RunnerName)
	if err != nil {
		return // not a runner of this store's
	}
	for _, g := range o.groupList() {
		if g.cfg().Name != r.Group || (g.ss != nil) != fromScaleSet {
			continue
		}
		if queue {
			g.observe(JobQueue, j.StartedAt.Sub(j.CreatedAt))
			// A runner that took its job between two passes is never seen
			// online by one: its start-up ends when the forge started it.
			if r.OnlineAt.IsZero() && o.firstStart(r.Name) {
				// The forge's date is cut to the second: the start lies
				// before it + 1 s, and before now.
				end := j.StartedAt.Add(time.Second)
				if now := o.now(); now.Before(end) {
					end = now
				}
				g.observe(RunnerStartup, end.Sub(g.spawnStart(r)))
			}
		}
		if run {
			g.observe(JobRun, j.CompletedAt.Sub(j.StartedAt))
		}
	}
}

// firstStart reports whether a runner's start-up is not yet recorded, and
// records that it is now.
func (o *Orchestrator) firstStart(runner string) bool {
	o.timedMu.Lock()
	defer o.timedMu.Unlock()
	if o.started == nil || len(o.started) > maxTimedJobs {
		o.started = map[string]bool{}
	}
	first := !o.started[runner]
	o.started[runner] = true
	return first
}

// maxTimedJobs bounds the memory of jobs already timed.
const maxTimedJobs = 20000
