package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/store"
)

// retireIdle makes reaping an idle runner safe: the plan read a listing,
// and the runner may have taken a job since. The forge's runner list
// first: a busy runner is kept. Then, where the forge can (Gitea), the
// runner is disabled — it takes no new job — and a fresh job listing
// shows whether it took one before that: kept if so. Only then is its
// registration removed, before its VM goes (GitHub, which cannot
// disable, refuses that removal for a runner running a job: kept too).
// A forge that cannot be read keeps them all. Runners whose job is done
// are not asked about.
func (g *group) retireIdle(ctx context.Context, reap map[string]string, byName map[string]store.Runner) error {
	var idle []string
	for name, reason := range reap {
		if r := byName[name]; r.State == store.Idle && reason != reasonJobFinished {
			idle = append(idle, name)
		}
	}
	if len(idle) == 0 {
		return nil
	}
	keep := func(name, why string) {
		g.dep.log.Info("kept a runner about to be retired", "group", g.cfg().Name, "runner", name, "reason", reap[name], "why", why)
		delete(reap, name)
	}
	keepAll := func(err error) error {
		for _, name := range idle {
			delete(reap, name)
		}
		g.setForgeDown(true)
		return fmt.Errorf("forge %s, before retiring idle runners (kept): %w", g.cfg().Forge, err)
	}
	registered, err := g.demand.client().Runners(ctx, g.scope)
	if err != nil {
		return keepAll(err)
	}
	at := map[string]forge.Runner{}
	for _, fr := range registered {
		at[fr.Name] = fr
	}
	var errs []error
	var retiring []string
	disabled := false
	for _, name := range idle {
		fr, ok := at[name]
		switch {
		case !ok:
			continue // never registered, or the forge removed it already
		case fr.Busy:
			keep(name, "the forge shows it busy")
			continue
		}
		if err := g.dep.fenced(); err != nil {
			return keepAll(err)
		}
		did, err := g.demand.client().DisableRunner(ctx, g.scope, fr.ID)
		if err != nil {
			keep(name, "disabling failed")
			errs = append(errs, fmt.Errorf("disabling idle runner %s: %w", name, err))
			continue
		}
		disabled = disabled || did
		retiring = append(retiring, name)
	}
	if disabled {
		g.forge.markStale(g.scope)
		l, err := g.listing(ctx, g.dep.now())
		if err != nil {
			return errors.Join(append(errs, keepAll(err))...)
		}
		for _, name := range retiring {
			if j, ok := l.running[name]; ok && j.ID != 0 {
				keep(name, fmt.Sprintf("it took job %d", j.ID))
			}
		}
	}
	for _, name := range retiring {
		if _, ok := reap[name]; !ok {
			continue
		}
		if err := g.dep.fenced(); err != nil {
			return keepAll(err)
		}
		if err := g.demand.client().DeleteRunner(ctx, g.scope, at[name].ID); err != nil {
			var ae *forge.APIError
			if errors.Is(err, forge.ErrRunnerBusy) || (errors.As(err, &ae) && ae.Status == http.StatusUnprocessableEntity) {
				// GitHub: "is still running a job". Not a failure.
				keep(name, "the forge says it runs a job")
				continue
			}
			keep(name, "removing its registration failed")
			errs = append(errs, fmt.Errorf("removing the registration of idle runner %s: %w", name, err))
			continue
		}
		r := byName[name]
		r.ForgeRunnerID = 0 // removed: destroy has nothing left there
		byName[name] = r
	}
	return errors.Join(errs...)
}

// tookJob marks a runner busy with job j (its start-up time is known now
// unless it was seen online before).
func (g *group) tookJob(r *store.Runner, j forge.Job, now time.Time) {
	r.State, r.StateAt, r.JobID, r.JobRepo = store.Busy, now, j.ID, j.Repo
	g.cameOnline(r, now)
}

// cameOnline records the first time a runner is seen online (or busy):
// from then on idle time counts, and its start-up time is known.
func (g *group) cameOnline(r *store.Runner, now time.Time) {
	if r.OnlineAt.IsZero() {
		r.OnlineAt = now
		if g.dep.firstStart(r.Name) {
			g.observe(RunnerStartup, now.Sub(g.spawnStart(*r)))
		}
	}
}

// spawnStart is when the runner's create_vm was begun (its row's creation
// when this process did not spawn it), forgotten once asked for.
func (g *group) spawnStart(r store.Runner) time.Time {
	g.mu.Lock()
	defer g.mu.Unlock()
	at, ok := g.spawnedAt[r.Name]
	delete(g.spawnedAt, r.Name)
	if !ok {
		return r.CreatedAt
	}
	return at
}

// reapInBackground deletes a runner without holding up the group's passes
// (delete_vm waits for the VM to go: a webhook's runner would wait behind
// it). The runner is no supply from now on, but keeps its place under
// max_active_runners until it is gone (planConfig).
func (g *group) reapInBackground(ctx context.Context, r store.Runner, reason string) {
	g.mu.Lock()
	if g.reaping == nil {
		g.reaping = map[string]bool{}
	}
	if g.reaping[r.Name] {
		g.mu.Unlock()
		return
	}
	g.reaping[r.Name] = true
	g.mu.Unlock()
	g.spawns.Add(1)
	go func() {
		defer g.spawns.Done()
		err := g.destroy(ctx, r, reason)
		g.mu.Lock()
		delete(g.reaping, r.Name)
		if err != nil && ctx.Err() == nil {
			g.reapErr = errors.Join(g.reapErr, err)
		}
		g.mu.Unlock()
		if err == nil {
			g.demand.forget(r.Name)
		}
		g.wake() // its place is free
	}()
}

// planConfig is what a pass plans with: the rows of runners being deleted
// in the background left out (no supply, nothing more to decide), their
// places taken off max_active_runners.
func (g *group) planConfig(c config.GroupConfig, runners []store.Runner) (config.GroupConfig, []store.Runner) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.reaping) == 0 {
		return c, runners
	}
	out := make([]store.Runner, 0, len(runners))
	for _, r := range runners {
		if g.reaping[r.Name] {
			c.MaxActiveRunners--
			continue
		}
		out = append(out, r)
	}
	return c, out
}

// isReaping: the runner is being deleted in the background (nothing else
// deletes it meanwhile).
func (g *group) isReaping(name string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.reaping[name]
}

// takenForReaping: a background deletion has the runner, or had it since
// the caller read its row (the row says deleting or deleted by now).
func (g *group) takenForReaping(name string) bool {
	if g.isReaping(name) {
		return true
	}
	r, err := g.dep.store.Get(name)
	return err == nil && (r.State == store.Deleting || r.State == store.Deleted)
}
