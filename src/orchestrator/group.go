package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/store"
)

// group is one runner group and its reconcile loop. Its name, forge,
// scope and CPI are fixed; the rest of its config may be replaced while
// it runs (Orchestrator.Replace), read through cfg.
type group struct {
	dep   *groupDeps
	conf  atomic.Pointer[groupConf]
	forge *forgeView
	cpi   CPI
	scope forge.Scope
	kick  chan struct{}
	// done is closed when the group's loop has ended after retiring.
	done chan struct{}

	mu       sync.Mutex
	inflight map[string]bool // runners whose spawn runs in this process
	// spawnedAt: when a runner's spawn left the queue for create_vm (in
	// memory: after a restart start-up counts from the row's creation).
	spawnedAt map[string]time.Time
	foreign   map[string]bool // VMs of another store already reported
	drained   bool
	status    GroupStatus
	backoff   time.Duration
	// forgeDown: the last pass failed reading the forge (its job
	// listing, a job, its runner list); a delivery from it (Kick) ends
	// that backoff.
	forgeDown bool
	lastSweep time.Time
	sweepDue  bool // a pass asked for a sweep
	// sweepRemoved: the last sweep removed runners.
	sweepRemoved bool
	spawnSem     chan struct{}
	spawns       sync.WaitGroup
	spawnErr     error // failures of background spawns, reported by the next pass
	// spawnFailing: the last spawn failed: the backoff keeps growing
	// across the passes that start the next ones, until one succeeds.
	spawnFailing bool
	// reaping: runners being deleted in the background (their VM's
	// deletion waits for it to go); reapErr: their failures, reported by
	// the next pass.
	reaping map[string]bool
	reapErr error

	// While this process acts for the group: the context its work runs
	// under, cancelled when the lead is lost.
	leadCtx    context.Context
	leadCancel context.CancelFunc
	leadErr    string // the last leadership error logged
	// retired: every runner, VM and registration of a retiring group is
	// gone.
	retired bool
	// dropping: the group was left out of the engine's set: once
	// retired, its loop drops it and ends.
	dropping     atomic.Bool
	spawnCancels map[string]context.CancelFunc // spawns in flight (stopSpawns)
	// Runners registered that take none of the group's jobs: how long
	// the group makes no new runner (doubling each time), until when,
	// and which were reported.
	pickupHold time.Duration
	holdUntil  time.Time
	stuck      bool // the last pass had such runners
	reported   map[string]bool
	// demand: where its jobs come from; ss: the group's scale set
	// (demand: scale_set, then also its demand), else nil.
	demand demand
	ss     *scaleSetGroup
}

// groupConf is one version of a group's config, with what is derived
// from it.
type groupConf struct {
	config.GroupConfig
	labels forge.LabelSet
}

// cfg is the group's current config: read it once per step that needs
// its parts to agree.
func (g *group) cfg() *groupConf { return g.conf.Load() }

func (g *group) setConf(c config.GroupConfig) {
	g.conf.Store(&groupConf{GroupConfig: c, labels: forge.NewLabelSet(c.Labels)})
}

// GroupStatus is what /api/v1/groups shows (seed 001's status, and more).
type GroupStatus struct {
	Name             string    `json:"name"`
	Forge            string    `json:"forge"`
	Scope            string    `json:"scope"`
	Labels           []string  `json:"labels"`
	MaxActiveRunners int       `json:"max_active_runners"`
	MinIdle          int       `json:"min_idle"`
	ActiveRunners    int       `json:"active_runners"`
	Creating         int       `json:"creating"`
	Idle             int       `json:"idle"`
	Busy             int       `json:"busy"`
	Deleting         int       `json:"deleting"`
	QueuedJobs       int       `json:"queued_jobs"`
	Drained          bool      `json:"drained"`
	LastCheckTime    time.Time `json:"last_check_time"`
	LastError        string    `json:"last_error,omitempty"`
	// LastErrorBrief is LastError with what a forge answered cut to its
	// status (forge.Brief): for whoever wrote the group but not the
	// daemon's config (a Kubernetes object's status).
	LastErrorBrief string    `json:"-"`
	BackoffUntil   time.Time `json:"backoff_until,omitzero"`
	// NotTakingJobs: runners online past timeouts.pickup that took none
	// of the group's jobs queued beside them; meanwhile, and until
	// SpawnsHeldUntil, the group makes no runner.
	NotTakingJobs   int       `json:"not_taking_jobs,omitempty"`
	SpawnsHeldUntil time.Time `json:"spawns_held_until,omitzero"`
	// ScaleSet: a scale-set group's scale set and its statistics (while
	// this process acts for the group).
	ScaleSet *ScaleSetStatus `json:"scale_set,omitempty"`
	// Acting: this process acts for the group (with replicas on
	// PostgreSQL, exactly one does; the others keep Acting false).
	Acting      bool      `json:"acting"`
	ActingSince time.Time `json:"acting_since,omitzero"`
	// Retiring: the group is being removed (its runners, VMs and
	// registrations deleted, none made); Retired: that is done.
	Retiring bool `json:"retiring,omitempty"`
	Retired  bool `json:"retired,omitempty"`
	Priority int  `json:"priority"`
}

func (g *group) wake() {
	select {
	case g.kick <- struct{}{}:
	default:
	}
}

func (g *group) isDrained() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.drained
}

// Status returns a copy of the group's status.
func (g *group) Status() GroupStatus {
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.status
	c := g.cfg()
	s.Name, s.Forge, s.Scope, s.Labels, s.Priority = c.Name, c.Forge, g.scope.String(), c.Labels, c.Priority
	s.MaxActiveRunners, s.MinIdle, s.Drained = c.MaxActiveRunners, c.MinIdle, g.drained
	s.Retiring, s.Retired = c.Retire, g.retired
	return s
}

// pollInterval is how old the group's queue listing may be.
func (g *group) pollInterval() time.Duration {
	if g.cfg().PollInterval.Duration != 0 {
		return g.cfg().PollInterval.Duration
	}
	return g.forge.conf().PollInterval.Duration
}

const (
	minBackoff = 2 * time.Second
	maxBackoff = 5 * time.Minute
)

func (g *group) loop(ctx context.Context) {
	g.spawnSem = make(chan struct{}, g.cfg().SpawnConcurrency)
	defer g.spawns.Wait()
	defer g.demand.stop() // a scale set's session deleted before the daemon exits
	// Passes also pace the sweep; between forge polls they use the cached
	// listing, so a long poll interval costs no forge requests.
	poll := min(g.pollInterval(), g.dep.sweepInterval)
	for ctx.Err() == nil {
		var err error
		if lctx, acting := g.lead(ctx); acting && g.cfg().Retire {
			var done bool
			if done, err = g.retirePass(lctx); done && g.dropping.Load() {
				g.dep.drop(g)
				return
			}
		} else if acting {
			g.demand.start(lctx)
			err = g.pass(lctx)
		} else if g.standby(); g.dropping.Load() && g.Status().ActiveRunners == 0 {
			// Another replica acts for it and has removed every runner.
			g.dep.drop(g)
			return
		}
		g.mu.Lock()
		next := poll
		if err != nil && ctx.Err() == nil {
			g.backoff = min(max(g.backoff*2, minBackoff), maxBackoff)
			next = g.backoff
			g.status.LastError = g.dep.redact.Redact(err.Error())
			g.status.LastErrorBrief = g.dep.redact.Redact(forge.Brief(err))
			g.status.BackoffUntil = g.dep.now().Add(next)
			g.dep.metrics.reconcileErrors.WithLabelValues(g.cfg().Name).Inc()
			g.dep.log.Warn("reconcile failed; backing off", "group", g.cfg().Name, "err", err, "retry_in", next)
		} else {
			if !g.spawnFailing {
				g.backoff = 0
			}
			g.status.LastError = g.leadErr // "" unless leadership is unknown
			g.status.LastErrorBrief = g.leadErr
			if g.status.LastError == "" && g.status.ScaleSet != nil && g.status.Acting {
				g.status.LastError = g.status.ScaleSet.LastError // the session's trouble
				if g.status.LastError != "" {
					// Its words may be the service's answer: the log has them.
					g.status.LastErrorBrief = "the scale set's message session fails (the daemon's log says why)"
				}
			}
			g.status.BackoffUntil = time.Time{}
		}
		g.mu.Unlock()
		t := time.NewTimer(next)
		if err != nil && !g.isForgeDown() {
			// Backing off a failure of the CPI or the store: webhooks do
			// not shorten the wait.
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		} else {
			// A delivery from a forge that failed proves it is back: the
			// backoff ends with it (the next pass resets it).
			select {
			case <-ctx.Done():
			case <-g.kick:
			case <-t.C:
			}
		}
		t.Stop()
	}
}

func (g *group) isForgeDown() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.forgeDown
}

func (g *group) setForgeDown(down bool) {
	g.mu.Lock()
	g.forgeDown = down
	g.mu.Unlock()
}

// pass is one reconcile of the group: what ended is swept first, then
// one plan over what is left (the runners, the jobs its demand counts)
// decides, and is carried out.
func (g *group) pass(ctx context.Context) error {
	dep := g.dep
	// Acting on a lost store would forget every runner made from here on:
	// stop until the operator restores it (health says why).
	if err := dep.store.Check(); err != nil {
		return err
	}
	drained, err := g.syncDrained()
	if err != nil {
		return err
	}
	c := g.cfg()
	if err := g.demand.sync(ctx, c.GroupConfig); err != nil {
		return err
	}
	now := dep.now()
	g.mu.Lock()
	g.status.LastCheckTime = now
	// A spawn failed since the last pass: report it (the loop backs off)
	// and make no new runner in this pass.
	spawnErr, reapErr := g.spawnErr, g.reapErr
	g.spawnErr, g.reapErr = nil, nil
	g.mu.Unlock()
	errs, forgeDown := g.sweepIfDue(ctx, now, drained)
	if forgeDown {
		// A forge that cannot be read decides nothing: the pass ends.
		return errors.Join(errs...)
	}
	// Read before the listing, which a delivery updates with it: a
	// runner taken as finished has its job done in the listing too, so
	// demand counted after reaping it does not include that job.
	finished := g.demand.finished(now)
	l, err := g.listing(ctx, now)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	runners, err := dep.store.Active(c.Name)
	if err != nil {
		return err
	}
	// Runners being deleted in the background (reaped by an earlier
	// pass) are no supply: planConfig leaves them out.
	pc, runners := g.planConfig(c.GroupConfig, runners)
	d := plan(&pc, now, l, l.owned[c.Name], runners, g.inflightNow(), finished, drained)
	g.checkPickup(&d, now)
	dep.metrics.queued.WithLabelValues(c.Name).Set(float64(d.queued))
	// Spawns start before the plan's changes to existing runners (their
	// forge and CPI calls would delay a webhook's runner by seconds). A
	// runner about to be deleted still holds its place under
	// max_active_runners, so this never exceeds it.
	if spawnErr == nil {
		g.startSpawns(ctx, d.spawn, l)
	}
	again, sweepNow, actErrs, err := g.act(ctx, d, runners, now)
	if err != nil {
		return err
	}
	if sweepNow {
		// The plan's changes call for the sweep (a trigger job taken):
		// it looks now, behind the spawns started above.
		g.sweepDue = true
		sweepErrs, _ := g.sweepIfDue(ctx, now, drained)
		actErrs = append(actErrs, sweepErrs...)
		again = again || g.sweepRemoved
	}
	if again {
		// Supply the plan counted is gone: the next pass, at once,
		// counts demand again.
		g.wake()
	}
	g.refreshStatus(d.queued)
	return errors.Join(append(append(errs, actErrs...), spawnErr, reapErr)...)
}

// sweepIfDue sweeps when the sweep interval has passed or a pass asked
// for it, unless the last pass found the forge down (the sweep reads it
// too: it waits for a listing to succeed). When it removed runners, a
// cheap listing is read afresh: a runner whose process ended may have run
// a job the cached listing still shows queued. forgeDown: the sweep
// could not read the forge.
func (g *group) sweepIfDue(ctx context.Context, now time.Time, drained bool) (errs []error, forgeDown bool) {
	g.sweepRemoved = false
	if g.isForgeDown() || (!g.sweepDue && now.Sub(g.lastSweep) < g.dep.sweepInterval) {
		return nil, false
	}
	n, err := g.sweep(ctx)
	g.sweepRemoved = n > 0
	if err != nil {
		return []error{err}, g.isForgeDown()
	}
	g.lastSweep, g.sweepDue = now, false
	if n > 0 && !drained && g.forge.cheapListing() {
		g.forge.markStale(g.scope)
	}
	return nil, false
}

// startSpawns starts a runner for each trigger job.
func (g *group) startSpawns(ctx context.Context, triggers []int64, l listing) {
	for _, trigger := range triggers {
		g.startSpawn(ctx, trigger, l.jobs[trigger].Repo)
	}
}

// listing is the jobs the group's demand counts. A forge that cannot be
// read decides nothing and deletes nothing: the error stops the pass.
func (g *group) listing(ctx context.Context, now time.Time) (listing, error) {
	g.setForgeDown(false)
	l, err := g.demand.listing(ctx, now)
	g.setForgeDown(err != nil)
	if err != nil {
		err = fmt.Errorf("forge %s: %w", g.cfg().Forge, err)
		g.dep.failure(g.cfg().Name, "forge", err)
		return listing{}, err
	}
	return l, nil
}

// inflightNow copies the runners whose spawn runs in this process.
func (g *group) inflightNow() map[string]bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := make(map[string]bool, len(g.inflight))
	for k := range g.inflight {
		out[k] = true
	}
	return out
}

// act carries out a plan's changes to existing runners: busy marks,
// recoveries, cleared triggers, confirmations, reaping. It answers
// whether supply the plan counted was removed (again: demand is counted
// anew), whether the sweep must look now, the errors to report, and a
// store error that stops the pass.
func (g *group) act(ctx context.Context, d decision, runners []store.Runner, now time.Time) (again, sweepNow bool, errs []error, fatal error) {
	dep := g.dep
	byName := map[string]store.Runner{}
	for _, r := range runners {
		byName[r.Name] = r
	}
	for name, j := range d.busy {
		r := byName[name]
		g.tookJob(&r, j, now)
		if err := dep.store.Save(r); err != nil {
			return false, false, nil, err
		}
		dep.log.Info("runner took a job", "group", g.cfg().Name, "runner", name, "job", j.ID, "repo", j.Repo)
	}
	for _, r := range d.recover {
		gone, err := g.recover(ctx, r)
		if err != nil {
			errs = append(errs, err)
		}
		again = again || gone
	}
	for _, r := range d.taken {
		r.TriggerJob = 0
		if err := dep.store.Save(r); err != nil {
			return false, false, nil, err
		}
		sweepNow = true
	}
	for _, r := range d.confirm {
		reason, taken, err := g.confirm(ctx, r)
		switch {
		case err != nil:
			errs = append(errs, err)
		case reason != "":
			d.reap[r.Name] = reason
			again = again || r.State == store.Idle // an idle runner was supply
		case taken:
			// Another runner took the job this one was made for: this one
			// may have run another job meanwhile and be gone. The sweep
			// (its process, the forge's runner list) tells now.
			sweepNow = true
		}
	}
	if err := g.retireIdle(ctx, d.reap, byName); err != nil {
		errs = append(errs, err)
	}
	for name, reason := range d.reap {
		g.reapInBackground(ctx, byName[name], reason)
	}
	return again, sweepNow, errs, nil
}

// refreshStatus recounts the group's runners for status and metrics
// (queued < 0: not known, as on a replica not acting for the group).
func (g *group) refreshStatus(queued int) {
	runners, err := g.dep.store.Active(g.cfg().Name)
	if err != nil {
		return
	}
	c := map[string]int{}
	for _, r := range runners {
		c[r.State]++
	}
	var ss *ScaleSetStatus
	if g.ss != nil && queued >= 0 {
		ss = g.scaleSetStatus(c[store.Busy], g.isDrained() || g.cfg().Retire)
	}
	g.mu.Lock()
	g.status.ScaleSet = ss
	g.status.ActiveRunners = len(runners)
	g.status.Creating, g.status.Idle, g.status.Busy, g.status.Deleting = c[store.Spawning], c[store.Idle], c[store.Busy], c[store.Deleting]
	if queued >= 0 {
		g.status.QueuedJobs = queued
	}
	g.mu.Unlock()
	if queued >= 0 {
		g.dep.hist.Record(g.cfg().Name, g.dep.now(), queued, len(runners))
	}
	for _, s := range []string{store.Spawning, store.Idle, store.Busy, store.Deleting} {
		g.dep.metrics.runners.WithLabelValues(g.cfg().Name, s).Set(float64(c[s]))
	}
}
