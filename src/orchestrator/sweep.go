package orchestrator

import (
	"context"
	"errors"
	"fmt"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/rpc"
)

// sweep runs the slower checks: has_vm per runner, the forge's runner
// list (registration ids, ephemeral runners the forge already removed,
// offline registrations of runners we deleted), and VMs of this group
// that no runner row accounts for. It answers how many runners it
// removed.
func (g *group) sweep(ctx context.Context) (int, error) {
	dep := g.dep
	if err := dep.store.Check(); err != nil {
		return 0, err
	}
	runners, err := dep.store.Active(g.cfg().Name)
	if err != nil {
		return 0, err
	}
	vms, err := g.listVMs(ctx)
	if err != nil {
		return 0, err
	}
	// reaped: runners this sweep deleted. Their VMs are still in the list
	// taken before: not strays, and not to be deleted a second time.
	reaped := map[string]bool{}
	live, errs := g.sweepVMs(ctx, runners, vms, reaped)
	// A scale-set group with no runner reads no runner list: at rest it
	// sends GitHub's REST API nothing (its runners are removed through
	// the Actions service).
	if g.ss == nil || len(live) > 0 {
		if err := g.sweepRegistrations(ctx, live, reaped); err != nil {
			return len(reaped), errors.Join(append(errs, err)...)
		}
	}
	errs = append(errs, g.sweepStrays(ctx, vms, live, reaped))
	return len(reaped), errors.Join(errs...)
}

// sweepVMs checks each idle or busy runner's VM: gone, or its process
// ended (list_vms on Runway's CPI; has_vm elsewhere), it is deleted. It
// answers the runners still live.
func (g *group) sweepVMs(ctx context.Context, runners []store.Runner, vms []listedVM, reaped map[string]bool) (map[string]store.Runner, []error) {
	dep := g.dep
	var errs []error
	live := map[string]store.Runner{}
	for _, r := range runners {
		live[r.Name] = r
	}
	vmState := map[string]string{}
	for _, vm := range vms {
		vmState[vm.AgentID] = vm.State
	}
	for _, r := range runners {
		if (r.State != store.Idle && r.State != store.Busy) || r.VMCID == "" || g.isReaping(r.Name) {
			continue
		}
		reason := ""
		if vms != nil {
			// list_vms (Runway's CPI) shows the runner's process too: an
			// ephemeral runner's process ends with its job.
			switch st, ok := vmState[r.AgentID]; {
			case !ok:
				reason = "vm gone"
			case st == "stopped" || st == "error":
				reason = reasonProcessExited + " (" + st + ")"
			}
		} else {
			exists, err := g.hasVM(ctx, r.VMCID)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			if !exists {
				reason = "vm gone"
			}
		}
		if reason != "" {
			delete(live, r.Name)
			reaped[r.Name] = true
			if !g.takenForReaping(r.Name) {
				errs = append(errs, g.destroy(ctx, r, reason))
			}
			continue
		}
		r.VMCheckedAt = dep.now()
		live[r.Name] = r
		errs = append(errs, dep.store.Save(r))
	}
	return live, errs
}

// sweepRegistrations reads the forge's runner list: registration ids of
// new runners, ephemeral runners the forge already removed (deleted
// here), offline registrations of runners this orchestrator retired
// (removed there).
func (g *group) sweepRegistrations(ctx context.Context, live map[string]store.Runner, reaped map[string]bool) error {
	dep := g.dep
	registered, err := g.demand.client().Runners(ctx, g.scope)
	if err != nil {
		g.setForgeDown(true)
		return fmt.Errorf("forge %s runners: %w", g.cfg().Forge, err)
	}
	var errs []error
	atForge := map[string]forge.Runner{}
	for _, fr := range registered {
		atForge[fr.Name] = fr
		if _, ok := live[fr.Name]; ok || fr.Status != "offline" {
			continue
		}
		// Only registrations this orchestrator made and already retired.
		if row, err := dep.store.Get(fr.Name); err == nil && row.Group == g.cfg().Name && row.State == store.Deleted {
			if err := dep.fenced(); err != nil {
				return err
			}
			if err := g.demand.client().DeleteRunner(ctx, g.scope, fr.ID); err != nil {
				errs = append(errs, err)
			} else {
				dep.log.Info("removed offline registration", "group", g.cfg().Name, "runner", fr.Name, "id", fr.ID)
			}
		}
	}
	for name, r := range live {
		if r.State != store.Idle || g.isReaping(name) {
			continue
		}
		fr, ok := atForge[r.Name]
		switch {
		case ok && g.ss != nil && fr.Busy:
			// A scale set's runner running a job its listener never
			// heard of (started before a takeover or a restart): not
			// supply for the jobs waiting. Its job's end reaps it (the
			// JobCompleted, its process, or its leaving the forge).
			r.ForgeRunnerID, r.State, r.StateAt = fr.ID, store.Busy, dep.now()
			g.cameOnline(&r, dep.now())
			errs = append(errs, dep.store.Save(r))
		case ok && (r.ForgeRunnerID == 0 || (r.OnlineAt.IsZero() && (fr.Status == "online" || fr.Busy))):
			r.ForgeRunnerID = fr.ID
			if fr.Status == "online" || fr.Busy {
				g.cameOnline(&r, dep.now())
			}
			errs = append(errs, dep.store.Save(r))
		case !ok && r.ForgeRunnerID != 0:
			// It registered, and the forge removed it: an ephemeral
			// runner goes once its one job is done.
			reaped[r.Name] = true
			delete(live, name)
			if !g.takenForReaping(r.Name) {
				errs = append(errs, g.destroy(ctx, r, reasonLeftForge))
			}
		}
	}
	return errors.Join(errs...)
}

// sweepStrays deletes VMs of this store's group that no runner accounts
// for; a VM of another store is reported, never deleted.
func (g *group) sweepStrays(ctx context.Context, vms []listedVM, live map[string]store.Runner, reaped map[string]bool) error {
	dep := g.dep
	var errs []error
	foreign := 0
	for _, vm := range vms {
		if _, ok := live[vm.AgentID]; ok || reaped[vm.AgentID] {
			continue
		}
		// Only VMs this store made are its strays. Others of the group
		// (an older store's, after runway.db was lost) may be live
		// runners: they are reported, never deleted.
		if vm.Tags["runway_store"] != dep.store.ID() {
			foreign++
			if g.reportForeign(vm.CID) {
				dep.log.Warn("a VM of this group was made by another state store: left alone (delete it with runway call delete_vm if it is not in use)",
					"group", g.cfg().Name, "vm", vm.CID, "agent_id", vm.AgentID, "store", vm.Tags["runway_store"])
			}
			continue
		}
		g.mu.Lock()
		flying := g.inflight[vm.AgentID]
		g.mu.Unlock()
		if flying {
			continue
		}
		dep.log.Warn("deleting a VM no runner accounts for", "group", g.cfg().Name, "vm", vm.CID, "agent_id", vm.AgentID)
		_, err := g.call(ctx, "delete_vm", vm.CID)
		var ce *rpc.Error
		if err != nil && !(errors.As(err, &ce) && ce.Type == rpc.TypeVMNotFound) {
			errs = append(errs, err)
		}
	}
	dep.metrics.foreignVMs.WithLabelValues(g.cfg().Name).Set(float64(foreign))
	return errors.Join(errs...)
}

// reportForeign says whether a foreign VM is new (worth a log line).
func (g *group) reportForeign(cid string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.foreign == nil {
		g.foreign = map[string]bool{}
	}
	seen := g.foreign[cid]
	g.foreign[cid] = true
	return !seen
}

// destroy deletes a runner's VM (finding it by agent id when the CID was
// never recorded) and its registration, then marks the row deleted. The
// row is marked deleting first, so a crash in between resumes here.
func (g *group) destroy(ctx context.Context, r store.Runner, reason string) error {
	dep := g.dep
	g.mu.Lock()
	delete(g.spawnedAt, r.Name)
	delete(g.reported, r.Name)
	g.mu.Unlock()
	if r.State != store.Deleting {
		r.State, r.StateAt, r.Reason = store.Deleting, dep.now(), reason
		if err := dep.store.Save(r); err != nil {
			return err
		}
	}
	dep.log.Info("deleting runner", "group", g.cfg().Name, "runner", r.Name, "vm", r.VMCID, "reason", reason)
	cids := []string{}
	if r.VMCID != "" {
		cids = append(cids, r.VMCID)
	} else {
		found, err := g.findVMs(ctx, r.AgentID)
		if err != nil {
			return g.keepError(r, fmt.Errorf("looking up the VM of %s: %w", r.Name, err))
		}
		for _, vm := range found {
			cids = append(cids, vm.CID)
		}
	}
	for _, cid := range cids {
		_, err := g.call(ctx, "delete_vm", cid)
		var ce *rpc.Error
		if err != nil && !(errors.As(err, &ce) && ce.Type == rpc.TypeVMNotFound) {
			return g.keepError(r, fmt.Errorf("delete_vm %s of %s: %w", cid, r.Name, err))
		}
	}
	if r.ForgeRunnerID != 0 && !(endedByItself(reason) && g.forge.removesFinishedRunners()) {
		if err := dep.fenced(); err != nil {
			return err
		}
		if err := g.demand.client().DeleteRunner(ctx, g.scope, r.ForgeRunnerID); err != nil {
			// The sweep retries: the row says deleted, the registration
			// stays ours to remove.
			dep.log.Warn("removing runner registration", "runner", r.Name, "err", err)
		}
	}
	r.State, r.StateAt, r.LastError = store.Deleted, dep.now(), ""
	if err := dep.store.Save(r); err != nil {
		return err
	}
	dep.event(g.cfg().Name, r.Name, RunnerDeleted, reason)
	return nil
}

func (g *group) keepError(r store.Runner, err error) error {
	r.LastError = g.dep.redact.Redact(err.Error())
	if serr := g.dep.store.Save(r); serr != nil {
		return serr
	}
	return err
}
