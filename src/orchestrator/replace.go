package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"

	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/rpc"
)

// RunnerEvent is one thing that happened to a runner, for a config
// source to show on its resource (Kubernetes events). Message is
// redacted.
type RunnerEvent struct {
	Group, Runner string
	// Type: RunnerCreated, RunnerDeleted or RunnerFailed.
	Type    string
	Message string
}

// RunnerEvent types.
const (
	RunnerCreated = "created"
	RunnerDeleted = "deleted"
	RunnerFailed  = "failed"
	// RunnerNotTaking: registered, online, and taking none of the jobs
	// queued for its labels (the group makes no more meanwhile).
	RunnerNotTaking = "not_taking"
)

// reasonRetired is the reap reason of a retiring group's runners.
const reasonRetired = "group deleted"

func (o *Orchestrator) event(group, runner, typ, msg string) {
	if o.events != nil {
		o.events(RunnerEvent{Group: group, Runner: runner, Type: typ, Message: o.redact.Redact(msg)})
	}
}

// Replace makes forges and groups the engine's whole set, while it runs:
// the one call through which a config source other than the file (the
// Kubernetes controller) hands over what it read. They are defaulted and
// validated as the file's are (config.PrepareSet); nothing changes when
// any of them is refused.
//
// A new group starts at once; a changed one takes its new config at its
// next step (max_active_runners, labels, timeouts, priority, the runner
// and its VM); its forge, scope, org, user, repo and cpi cannot change (an
// IdentityError naming the field: delete the group and make it anew). A
// group with Retire, or one left out, is retired: its spawns in flight
// are stopped, its runners' VMs deleted and their registrations removed,
// and no runner is made; GroupStatus.Retired says when nothing is left.
// A group left out is then dropped from the engine. A forge that changed
// gets a new client (its type cannot change while a group uses it).
func (o *Orchestrator) Replace(forges []config.ForgeConfig, groups []config.GroupConfig) error {
	forges, groups = slices.Clone(forges), slices.Clone(groups)
	if err := config.PrepareSet(forges, groups); err != nil {
		return err
	}
	o.setMu.Lock()
	defer o.setMu.Unlock()
	byName := map[string]*group{}
	for _, g := range o.groups {
		byName[g.cfg().Name] = g
	}
	for i, gc := range groups {
		if err := o.sameIdentity(byName[gc.Name], gc, i); err != nil {
			return err
		}
	}
	views, err := o.replaceForges(forges)
	if err != nil {
		return err
	}
	// Nothing is refused from here on.
	for name, fv := range views {
		o.forges[name] = fv
	}
	var next []*group
	keep := map[string]bool{}
	for _, gc := range groups {
		keep[gc.Name] = true
		if g := byName[gc.Name]; g != nil {
			if !reflect.DeepEqual(g.cfg().GroupConfig, gc) {
				g.update(gc)
			}
			g.dropping.Store(false)
			next = append(next, g)
			continue
		}
		g, err := o.buildGroup(gc)
		if err != nil {
			return err // the store failed: the groups so far are kept
		}
		next = append(next, g)
		if o.runCtx != nil {
			o.startLoop(g)
		}
		o.log.Info("group added", "group", gc.Name, "forge", gc.Forge, "scope", gc.ForgeScope())
	}
	for _, g := range o.groups {
		if c := g.cfg(); !keep[c.Name] {
			// Retired, then dropped by its own loop.
			if !g.dropping.Swap(true) {
				gc := c.GroupConfig
				gc.Retire = true
				g.update(gc)
				o.log.Info("group removed: retiring its runners", "group", c.Name)
			}
			next = append(next, g)
		}
	}
	o.groups = next
	for name := range o.forges {
		if _, ok := views[name]; !ok && !o.forgeUsed(name) {
			delete(o.forges, name)
		}
	}
	o.bumpOwnership()
	return nil
}

// replaceForges answers the forge views for the new set: kept, updated
// with a new client when their config changed, or made. It changes
// nothing yet but the clients of forges whose config changed (the first
// refusal comes before any of them).
func (o *Orchestrator) replaceForges(forges []config.ForgeConfig) (map[string]*forgeView, error) {
	type change struct {
		fv *forgeView
		fc config.ForgeConfig
	}
	views := map[string]*forgeView{}
	var changes []change
	for i, fc := range forges {
		fv := o.forges[fc.Name]
		switch {
		case fv == nil:
			f, err := o.buildForge(fc)
			if err != nil {
				return nil, err
			}
			views[fc.Name] = o.forgeView(fc, f)
		case fv.kind != fc.Type && o.forgeUsed(fc.Name):
			return nil, identityError("forges", i, "type", fmt.Sprintf("cannot change from %s to %s while groups use the forge", fv.kind, fc.Type))
		case fv.kind != fc.Type:
			f, err := o.buildForge(fc)
			if err != nil {
				return nil, err
			}
			views[fc.Name] = o.forgeView(fc, f)
		default:
			views[fc.Name] = fv
			if !reflect.DeepEqual(fv.conf(), fc) {
				changes = append(changes, change{fv, fc})
			}
		}
	}
	built := make([]Forge, len(changes))
	for i, c := range changes {
		f, err := o.buildForge(c.fc)
		if err != nil {
			return nil, err
		}
		built[i] = f
	}
	for i, c := range changes {
		c.fv.set(c.fc, built[i])
		o.log.Info("forge changed: new client", "forge", c.fc.Name)
	}
	return views, nil
}

// forgeUsed: a group of the engine uses the forge. The caller holds setMu.
func (o *Orchestrator) forgeUsed(name string) bool {
	for _, g := range o.groups {
		if g.forge.name == name {
			return true
		}
	}
	return false
}

// sameIdentity refuses a change to what an existing group's runners were
// made with (gc is groups[i]).
func (o *Orchestrator) sameIdentity(g *group, gc config.GroupConfig, i int) error {
	if g == nil {
		return nil
	}
	old := g.cfg().GroupConfig
	for _, f := range []struct {
		field    string
		was, now any
	}{
		{"forge", old.Forge, gc.Forge}, {"scope", old.Scope, gc.Scope}, {"org", old.Org, gc.Org},
		{"user", old.User, gc.User}, {"repo", old.Repo, gc.Repo},
		{"cpi", old.EffectiveCPI(o.cfg.CPI), gc.EffectiveCPI(o.cfg.CPI)},
		{"demand", old.Demand, gc.Demand}, {"scale_set", old.ScaleSet, gc.ScaleSet},
	} {
		if !reflect.DeepEqual(f.was, f.now) {
			return identityError("groups", i, f.field,
				"cannot change while the group exists (its runners were made with it): delete the group and make it anew")
		}
	}
	return nil
}

// update gives the group a new config (same identity).
func (g *group) update(gc config.GroupConfig) {
	g.setConf(gc)
	if !gc.Retire {
		g.mu.Lock()
		g.retired = false
		g.mu.Unlock()
	}
	g.dep.log.Info("group changed", "group", gc.Name, "max_active_runners", gc.MaxActiveRunners, "retire", gc.Retire)
	g.wake()
}

func (o *Orchestrator) bumpOwnership() {
	o.ownMu.Lock()
	o.ownGen++
	o.ownMu.Unlock()
}

// startLoop runs a group's loop under Run's context. The caller holds
// setMu.
func (o *Orchestrator) startLoop(g *group) {
	o.loops.Add(1)
	go func() {
		defer o.loops.Done()
		g.loop(o.runCtx)
	}()
}

// dropGroup removes a retired group left out of the set.
func (o *Orchestrator) dropGroup(g *group) {
	o.setMu.Lock()
	o.groups = slices.DeleteFunc(o.groups, func(x *group) bool { return x == g })
	o.setMu.Unlock()
	o.bumpOwnership()
	o.log.Info("group retired and dropped", "group", g.cfg().Name)
}

// retirePass removes what a retiring group has: its spawns in flight are
// stopped, every runner deleted (VM, then registration), any
// registration of its runners still at the forge removed, and any VM of
// the group this store made deleted. It answers true once nothing was
// left to remove.
func (g *group) retirePass(ctx context.Context) (bool, error) {
	g.mu.Lock()
	done := g.retired
	g.mu.Unlock()
	if done {
		return true, nil
	}
	dep, name := g.dep, g.cfg().Name
	g.demand.stop() // a retiring group takes no job: its session goes
	g.stopSpawns()
	g.spawns.Wait()
	if err := dep.store.Check(); err != nil {
		return false, err
	}
	runners, err := dep.store.Active(name)
	if err != nil {
		return false, err
	}
	var errs []error
	for _, r := range runners {
		errs = append(errs, g.destroy(ctx, r, reasonRetired))
	}
	registered, err := g.demand.client().Runners(ctx, g.scope)
	if err != nil {
		errs = append(errs, fmt.Errorf("forge %s runners: %w", g.forge.name, err))
	}
	for _, fr := range registered {
		if row, err := dep.store.Get(fr.Name); err == nil && row.Group == name {
			if err := dep.fenced(); err != nil {
				return false, errors.Join(append(errs, err)...)
			}
			if err := g.demand.client().DeleteRunner(ctx, g.scope, fr.ID); err != nil {
				errs = append(errs, fmt.Errorf("removing the registration of %s: %w", fr.Name, err))
			} else {
				dep.log.Info("removed a retired group's registration", "group", name, "runner", fr.Name, "id", fr.ID)
			}
		}
	}
	vms, err := g.listVMs(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, vm := range vms {
		if vm.Tags["runway_store"] != dep.store.ID() {
			continue // another store's: never ours to delete
		}
		_, err := g.call(ctx, "delete_vm", vm.CID)
		var ce *rpc.Error
		if err != nil && !(errors.As(err, &ce) && ce.Type == rpc.TypeVMNotFound) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return false, err
	}
	if len(runners) > 0 || len(vms) > 0 {
		// Removed something: look once more before calling it done.
		return false, nil
	}
	if err := g.deleteScaleSet(ctx); err != nil {
		return false, err
	}
	g.mu.Lock()
	g.retired = true
	g.mu.Unlock()
	g.refreshStatus(0)
	dep.log.Info("group retired: no runner, VM or registration left", "group", name)
	return true, nil
}

// stopSpawns cancels the group's spawns in flight (their rows stay
// spawning, for retirePass to delete).
func (g *group) stopSpawns() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, cancel := range g.spawnCancels {
		cancel()
	}
}
