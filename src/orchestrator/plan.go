package orchestrator

import (
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/store"
)

// Reap reasons for a runner that ended by itself.
const (
	reasonJobFinished   = "job finished"
	reasonProcessExited = "runner process exited"
	reasonLeftForge     = "runner left the forge after its job"
)

// endedByItself: the runner's job is done or its process ended. A forge
// that removes finished runners (removesFinishedRunners) has removed its
// registration already, or shows it offline, for the sweep to remove: no
// request is spent on it now.
func endedByItself(reason string) bool {
	return reason == reasonJobFinished || reason == reasonLeftForge || strings.HasPrefix(reason, reasonProcessExited)
}

// decision is what one pass decided, before any side effect: pure, so it
// can be tested and benchmarked without a forge or CPI.
type decision struct {
	busy    map[string]forge.Job // idle runner → the job it took
	confirm []store.Runner       // runner whose job left the listing
	taken   []store.Runner       // idle runner whose trigger job another runner took
	recover []store.Runner       // spawn cut short: adopt or delete its VM
	reap    map[string]string    // runner → reason
	spawn   []int64              // trigger job per new runner (0: warm pool)
	// notTaking: idle runners online past timeouts.pickup beside a job
	// of the group's queued as long, which they did not take.
	notTaking []store.Runner
	queued    int
	active    int
	unassign  int
}

// planTarget is how many runners without a job the group wants for
// queued jobs waiting: one each, and at least min_idle.
func planTarget(cfg *config.GroupConfig, queued int) int { return max(queued, cfg.MinIdle) }

// plan decides one pass. jobs is the scope's listing; owned the queued
// jobs this group claims; runners the group's rows that are not deleted;
// finished the runners a delivery said finished their job.
func plan(cfg *config.GroupConfig, now time.Time, l listing, owned []forge.Job,
	runners []store.Runner, inflight, finished map[string]bool, drained bool) decision {
	d := decision{busy: map[string]forge.Job{}, reap: map[string]string{}, queued: len(owned)}
	jobs, running := l.jobs, l.running
	covered := map[int64]bool{}
	for _, r := range runners {
		d.active++
		age := now.Sub(r.CreatedAt)
		if (r.State == store.Idle || r.State == store.Busy) && finished[r.Name] && running[r.Name].ID == 0 {
			// Its job is done: an ephemeral runner is gone with it,
			// whether or not a pass ever saw it busy.
			d.reap[r.Name] = reasonJobFinished
			continue
		}
		switch r.State {
		case store.Spawning:
			if !inflight[r.Name] {
				// Its create_vm was cut short (a restart): look the VM up.
				// It still counts as supply until that is settled.
				d.recover = append(d.recover, r)
			}
		case store.Idle:
			if j, ok := running[r.Name]; ok {
				d.busy[r.Name] = j
				continue
			}
			// Booting counts from the VM's creation (StateAt: an idle
			// runner's state began with it), not from the spawn's queueing.
			switch booting := r.OnlineAt.IsZero(); {
			case booting && now.Sub(r.StateAt) > cfg.Timeouts.Spawn.Duration:
				// Never seen online: it will not serve its job, which
				// gets a new runner once this one is gone (seed 001's TTL
				// retry, but from durable state).
				d.reap[r.Name] = "spawn timeout: never registered"
				continue
			case booting:
				// Within its boot timeout nothing reaps it, not even a
				// drain: it may be taking a job right now.
			case drained:
				d.reap[r.Name] = "group drained"
				continue
			case now.Sub(r.OnlineAt) > cfg.Timeouts.Idle.Duration:
				d.reap[r.Name] = "idle timeout"
				continue
			case age > cfg.Timeouts.MaxLifetime.Duration:
				d.reap[r.Name] = "max lifetime"
				continue
			}
			if !r.OnlineAt.IsZero() && waitedFor(owned, r.OnlineAt, now, cfg.Timeouts.Pickup.Duration) {
				d.notTaking = append(d.notTaking, r)
			}
			if r.TriggerJob != 0 {
				switch j, listed := jobs[r.TriggerJob]; {
				case !listed:
					d.confirm = append(d.confirm, r)
				case j.Status == forge.StatusInProgress && j.RunnerName != "" && j.RunnerName != r.Name:
					// This one may have run another job meanwhile and be
					// gone: the pass looks (sweep) before counting on it.
					d.taken = append(d.taken, r)
				}
			}
		case store.Busy:
			j, listed := jobs[r.JobID]
			switch {
			case age > cfg.Timeouts.MaxLifetime.Duration:
				d.reap[r.Name] = "max lifetime"
			case !listed || (j.Status == forge.StatusInProgress && j.RunnerName != "" && j.RunnerName != r.Name):
				d.confirm = append(d.confirm, r)
			}
			continue
		case store.Deleting:
			if inflight[r.Name] {
				// A failing spawn deletes its own; until it has, it is
				// the supply for its job (no second try before backoff).
				break
			}
			d.reap[r.Name] = r.Reason
			continue
		}
		d.unassign++
		if r.TriggerJob != 0 {
			covered[r.TriggerJob] = true
		}
	}
	if drained || len(d.notTaking) > 0 {
		// Runners that register and take nothing: more would too.
		return d
	}
	d.spawn = spawns(cfg, owned, covered, d.unassign, d.active)
	return d
}

// spawns: a trigger job per new runner (0: warm pool), for the queued
// jobs no unassigned runner covers, within max_active_runners.
func spawns(cfg *config.GroupConfig, owned []forge.Job, covered map[int64]bool, unassigned, active int) []int64 {
	var out []int64
	n := min(planTarget(cfg, len(owned))-unassigned, cfg.MaxActiveRunners-active)
	for _, j := range owned {
		if n <= len(out) {
			break
		}
		if !covered[j.ID] {
			out = append(out, j.ID)
		}
	}
	for len(out) < n {
		out = append(out, 0)
	}
	return out
}

// waitedFor: a queued job of owned was there beside a runner online
// since online for longer than pickup (a job's unknown date counts from
// the runner's).
func waitedFor(owned []forge.Job, online, now time.Time, pickup time.Duration) bool {
	if pickup <= 0 || now.Sub(online) <= pickup {
		return false
	}
	for _, j := range owned {
		if j.Status == forge.StatusQueued && now.Sub(later(j.CreatedAt, online)) > pickup {
			return true
		}
	}
	return false
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
