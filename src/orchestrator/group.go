package orchestrator

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/runway-cpi/runway/src/cpiclient"
	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/rpc"
)

// group is one runner group and its reconcile loop.
type group struct {
	o      *Orchestrator
	cfg    GroupConfig
	index  int
	forge  *forgeView
	cpi    CPI
	scope  forge.Scope
	labels forge.LabelSet
	kick   chan struct{}

	mu        sync.Mutex
	inflight  map[string]bool // runners whose spawn runs in this process
	foreign   map[string]bool // VMs of another store already reported
	drained   bool
	status    GroupStatus
	backoff   time.Duration
	lastSweep time.Time
	spawnSem  chan struct{}
	spawns    sync.WaitGroup
	spawnErr  error // failures of background spawns, reported by the next pass
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
	BackoffUntil     time.Time `json:"backoff_until,omitzero"`
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
	s.Name, s.Forge, s.Scope, s.Labels = g.cfg.Name, g.cfg.Forge, g.scope.String(), g.cfg.Labels
	s.MaxActiveRunners, s.MinIdle, s.Drained = g.cfg.MaxActiveRunners, g.cfg.MinIdle, g.drained
	return s
}

// pollInterval is how old the group's queue listing may be.
func (g *group) pollInterval() time.Duration {
	if g.cfg.PollInterval.Duration != 0 {
		return g.cfg.PollInterval.Duration
	}
	return g.forge.cfg.PollInterval.Duration
}

const (
	minBackoff = 2 * time.Second
	maxBackoff = 5 * time.Minute
)

func (g *group) loop(ctx context.Context) {
	g.spawnSem = make(chan struct{}, g.cfg.SpawnConcurrency)
	defer g.spawns.Wait()
	// Passes also pace the sweep; between forge polls they use the cached
	// listing, so a long poll interval costs no forge requests.
	poll := min(g.pollInterval(), g.o.cfg.SweepInterval.Duration)
	for ctx.Err() == nil {
		err := g.pass(ctx)
		g.mu.Lock()
		next := poll
		if err != nil && ctx.Err() == nil {
			g.backoff = min(max(g.backoff*2, minBackoff), maxBackoff)
			next = g.backoff
			g.status.LastError = err.Error()
			g.status.BackoffUntil = g.o.now().Add(next)
			g.o.metrics.reconcileErrors.WithLabelValues(g.cfg.Name).Inc()
			g.o.log.Warn("reconcile failed; backing off", "group", g.cfg.Name, "err", err, "retry_in", next)
		} else {
			g.backoff = 0
			g.status.LastError = ""
			g.status.BackoffUntil = time.Time{}
		}
		g.mu.Unlock()
		t := time.NewTimer(next)
		if err != nil {
			// While backing off, webhooks do not shorten the wait.
			select {
			case <-ctx.Done():
			case <-t.C:
			}
		} else {
			select {
			case <-ctx.Done():
			case <-g.kick:
			case <-t.C:
			}
		}
		t.Stop()
	}
}

// decision is what one pass decided, before any side effect: pure, so it
// can be tested and benchmarked without a forge or CPI.
type decision struct {
	busy     map[string]forge.Job // idle runner → the job it took
	confirm  []store.Runner       // runner whose job left the listing
	recover  []store.Runner       // spawn cut short: adopt or delete its VM
	reap     map[string]string    // runner → reason
	spawn    []int64              // trigger job per new runner (0: warm pool)
	queued   int
	active   int
	unassign int
}

// plan decides one pass. jobs is the scope's listing; owned the queued
// jobs this group claims; runners the group's rows that are not deleted.
func plan(cfg *GroupConfig, now time.Time, l listing, owned []forge.Job,
	runners []store.Runner, inflight map[string]bool, drained bool) decision {
	d := decision{busy: map[string]forge.Job{}, reap: map[string]string{}, queued: len(owned)}
	jobs, running := l.jobs, l.running
	covered := map[int64]bool{}
	for _, r := range runners {
		d.active++
		age := now.Sub(r.CreatedAt)
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
			switch {
			case drained:
				d.reap[r.Name] = "group drained"
				continue
			case now.Sub(r.StateAt) > cfg.Timeouts.Idle.Duration:
				d.reap[r.Name] = "idle timeout"
				continue
			case r.ForgeRunnerID == 0 && age > cfg.Timeouts.Spawn.Duration:
				// Never seen registered: it will not serve its job, which
				// gets a new runner once this one is gone (seed 001's TTL
				// retry, but from durable state).
				d.reap[r.Name] = "spawn timeout: never registered"
				continue
			case age > cfg.Timeouts.MaxLifetime.Duration:
				d.reap[r.Name] = "max lifetime"
				continue
			}
			if r.TriggerJob != 0 {
				if _, listed := jobs[r.TriggerJob]; !listed {
					d.confirm = append(d.confirm, r)
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
	if drained {
		return d
	}
	target := max(len(owned), cfg.MinIdle)
	n := min(target-d.unassign, cfg.MaxActiveRunners-d.active)
	for _, j := range owned {
		if n <= len(d.spawn) {
			break
		}
		if !covered[j.ID] {
			d.spawn = append(d.spawn, j.ID)
		}
	}
	for len(d.spawn) < n {
		d.spawn = append(d.spawn, 0)
	}
	return d
}

// pass is one reconcile of the group.
func (g *group) pass(ctx context.Context) error {
	o := g.o
	// Acting on a lost store would forget every runner made from here on:
	// stop until the operator restores it (health says why).
	if err := o.store.Check(); err != nil {
		return err
	}
	now := o.now()
	g.mu.Lock()
	g.status.LastCheckTime = now
	drained := g.drained
	// A spawn failed since the last pass: report it (the loop backs off)
	// and make no new runner in this pass.
	spawnErr := g.spawnErr
	g.spawnErr = nil
	g.mu.Unlock()
	sj, err := g.forge.jobs(ctx, g.scope, g.pollInterval(), now)
	if err != nil {
		// The forge could not be read: decide nothing from it, delete
		// nothing because of it.
		return fmt.Errorf("forge %s: %w", g.cfg.Forge, err)
	}
	l := o.partition(g.forge, sj)
	owned, jobs := l.owned[g.cfg.Name], l.jobs
	runners, err := o.store.Active(g.cfg.Name)
	if err != nil {
		return err
	}
	g.mu.Lock()
	inflight := make(map[string]bool, len(g.inflight))
	for k := range g.inflight {
		inflight[k] = true
	}
	g.mu.Unlock()
	d := plan(&g.cfg, now, l, owned, runners, inflight, drained)
	o.metrics.queued.WithLabelValues(g.cfg.Name).Set(float64(d.queued))

	byName := map[string]store.Runner{}
	for _, r := range runners {
		byName[r.Name] = r
	}
	var errs []error
	for name, j := range d.busy {
		r := byName[name]
		r.State, r.StateAt, r.JobID, r.JobRepo = store.Busy, now, j.ID, j.Repo
		if err := o.store.Save(r); err != nil {
			return err
		}
		o.log.Info("runner took a job", "group", g.cfg.Name, "runner", name, "job", j.ID, "repo", j.Repo)
	}
	for _, r := range d.recover {
		if err := g.recover(ctx, r); err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range d.confirm {
		reason, err := g.confirm(ctx, r)
		if err != nil {
			errs = append(errs, err)
		} else if reason != "" {
			d.reap[r.Name] = reason
		}
	}
	for name, reason := range d.reap {
		if err := g.destroy(ctx, byName[name], reason); err != nil {
			errs = append(errs, err)
		}
	}
	if spawnErr == nil {
		for _, trigger := range d.spawn {
			g.startSpawn(ctx, trigger, jobs[trigger].Repo)
		}
	}
	if now.Sub(g.lastSweep) >= o.cfg.SweepInterval.Duration {
		if err := g.sweep(ctx); err != nil {
			errs = append(errs, err)
		} else {
			g.lastSweep = now
		}
	}
	g.refreshStatus(d.queued)
	return errors.Join(append(errs, spawnErr)...)
}

// refreshStatus recounts the group's runners for status and metrics.
func (g *group) refreshStatus(queued int) {
	runners, err := g.o.store.Active(g.cfg.Name)
	if err != nil {
		return
	}
	c := map[string]int{}
	for _, r := range runners {
		c[r.State]++
	}
	g.mu.Lock()
	g.status.ActiveRunners = len(runners)
	g.status.Creating, g.status.Idle, g.status.Busy, g.status.Deleting = c[store.Spawning], c[store.Idle], c[store.Busy], c[store.Deleting]
	g.status.QueuedJobs = queued
	g.mu.Unlock()
	for _, s := range []string{store.Spawning, store.Idle, store.Busy, store.Deleting} {
		g.o.metrics.runners.WithLabelValues(g.cfg.Name, s).Set(float64(c[s]))
	}
}

// confirm asks the forge about a job that left the listing (listings can
// skip a job that changes state between pages). It returns a reap reason,
// or "" to keep the runner. An error keeps the runner too.
func (g *group) confirm(ctx context.Context, r store.Runner) (string, error) {
	id := r.JobID
	if r.State == store.Idle {
		id = r.TriggerJob
	}
	repo := r.JobRepo
	j, err := g.forge.client.Job(ctx, forge.Job{ID: id, Repo: repo})
	if errors.Is(err, forge.ErrNotFound) {
		j, err = forge.Job{ID: id, Status: forge.StatusCompleted}, nil
	}
	if err != nil {
		return "", fmt.Errorf("confirming job %d of runner %s: %w", id, r.Name, err)
	}
	mine := j.RunnerName == r.Name
	switch {
	case r.State == store.Busy && j.Status == forge.StatusCompleted:
		return "job finished", nil
	case r.State == store.Busy && j.RunnerName != "" && !mine:
		return "job taken over by " + j.RunnerName, nil
	case r.State == store.Idle && mine && j.Status == forge.StatusCompleted:
		return "job finished", nil
	case r.State == store.Idle && mine:
		r.State, r.StateAt, r.JobID, r.JobRepo = store.Busy, g.o.now(), j.ID, repo
		return "", g.o.store.Save(r)
	case r.State == store.Idle:
		// Another runner took the job it was made for: it stays as supply
		// for the next queued job.
		r.TriggerJob = 0
		return "", g.o.store.Save(r)
	}
	return "", nil
}

// recover settles a runner whose create_vm never answered (the daemon
// died mid-call): a VM found running under its agent id is adopted — it
// may already be running a job — anything else is deleted.
func (g *group) recover(ctx context.Context, r store.Runner) error {
	mine, err := g.findVMs(ctx, r.AgentID)
	if err != nil {
		return fmt.Errorf("recovering %s: %w", r.Name, err)
	}
	if len(mine) == 1 && mine[0].State == "running" {
		r.VMCID, r.State, r.StateAt = mine[0].CID, store.Idle, g.o.now()
		g.o.log.Info("adopted the VM of an interrupted spawn", "group", g.cfg.Name, "runner", r.Name, "vm", r.VMCID)
		return g.o.store.Save(r)
	}
	return g.destroy(ctx, r, "spawn interrupted")
}

// destroy deletes a runner's VM (finding it by agent id when the CID was
// never recorded) and its registration, then marks the row deleted. The
// row is marked deleting first, so a crash in between resumes here.
func (g *group) destroy(ctx context.Context, r store.Runner, reason string) error {
	o := g.o
	if r.State != store.Deleting {
		r.State, r.StateAt, r.Reason = store.Deleting, o.now(), reason
		if err := o.store.Save(r); err != nil {
			return err
		}
	}
	o.log.Info("deleting runner", "group", g.cfg.Name, "runner", r.Name, "vm", r.VMCID, "reason", reason)
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
	if r.ForgeRunnerID != 0 {
		if err := g.forge.client.DeleteRunner(ctx, g.scope, r.ForgeRunnerID); err != nil {
			// The sweep retries: the row says deleted, the registration
			// stays ours to remove.
			o.log.Warn("removing runner registration", "runner", r.Name, "err", err)
		}
	}
	r.State, r.StateAt, r.LastError = store.Deleted, o.now(), ""
	return o.store.Save(r)
}

func (g *group) keepError(r store.Runner, err error) error {
	r.LastError = err.Error()
	if serr := g.o.store.Save(r); serr != nil {
		return serr
	}
	return err
}

// findVMs returns this group's VMs made for agentID. A CPI
// without list_vms (any non-Runway CPI) answers NotImplemented: nothing can
// be found then, and that is logged.
func (g *group) findVMs(ctx context.Context, agentID string) ([]listedVM, error) {
	vms, err := g.listVMs(ctx)
	if err != nil {
		return nil, err
	}
	if vms == nil {
		g.o.log.Warn("the CPI cannot list VMs: a VM whose create_vm was interrupted cannot be found", "group", g.cfg.Name)
	}
	var out []listedVM
	for _, v := range vms {
		if v.AgentID == agentID {
			out = append(out, v)
		}
	}
	return out, nil
}

// call runs one CPI method, with metrics.
func (g *group) call(ctx context.Context, method string, args ...any) (*cpiclient.Response, error) {
	start := time.Now()
	resp, err := g.cpi.Call(ctx, method, "runway-"+g.cfg.Name+"-"+randHex(4), args...)
	g.o.metrics.cpiDuration.WithLabelValues(method).Observe(time.Since(start).Seconds())
	if err != nil {
		kind := "transport"
		var ce *rpc.Error
		if errors.As(err, &ce) {
			kind = ce.Type
		}
		g.o.metrics.cpiErrors.WithLabelValues(method, kind).Inc()
	}
	return resp, err
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// startSpawn records the intent to make one runner, then makes it in the
// background (bounded by spawn_concurrency) so a slow create_vm never
// stalls the group's reaping.
func (g *group) startSpawn(ctx context.Context, trigger int64, repo string) {
	o := g.o
	now := o.now()
	name := g.cfg.Name + "-" + randHex(5)
	r := store.Runner{Name: name, Group: g.cfg.Name, AgentID: name, State: store.Spawning, TriggerJob: trigger,
		JobRepo: repo, CreatedAt: now, StateAt: now}
	g.mu.Lock()
	g.inflight[name] = true
	g.mu.Unlock()
	if err := o.store.Save(r); err != nil {
		g.mu.Lock()
		delete(g.inflight, name)
		g.mu.Unlock()
		o.log.Error("recording a runner", "group", g.cfg.Name, "err", err)
		return
	}
	g.spawns.Add(1)
	go func() {
		defer g.spawns.Done()
		select {
		case g.spawnSem <- struct{}{}:
		case <-ctx.Done():
			return // the row stays "spawning": the next start recovers it
		}
		defer func() { <-g.spawnSem }()
		err := g.spawn(ctx, r)
		g.mu.Lock()
		delete(g.inflight, name)
		g.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			// The next pass reports it, so the group backs off instead of
			// trying again at once.
			o.log.Warn("spawn failed", "group", g.cfg.Name, "runner", name, "err", err)
			g.mu.Lock()
			g.spawnErr = errors.Join(g.spawnErr, err)
			g.mu.Unlock()
			return
		}
		g.wake()
	}()
}

func (g *group) spawn(ctx context.Context, r store.Runner) error {
	o := g.o
	start := time.Now()
	reg, err := g.forge.client.Register(ctx, g.scope, r.Name, g.cfg.Labels)
	if err != nil {
		r.LastError = "registration: " + err.Error()
		return errors.Join(fmt.Errorf("registering %s: %w", r.Name, err), g.destroy(ctx, r, "registration failed"))
	}
	if reg.RunnerID != 0 {
		r.ForgeRunnerID = reg.RunnerID
		if err := o.store.Save(r); err != nil {
			return err
		}
	}
	stemcell, err := g.stemcell(ctx)
	if err != nil {
		return errors.Join(err, g.destroy(ctx, r, "no stemcell"))
	}
	env := map[string]any{
		"user_data": bootstrap(g.cfg, g.forge.cfg, r.Name, reg),
		"bosh": map[string]any{"tags": map[string]any{"runway_group": g.cfg.Name, "runway_runner": r.Name,
			"runway_store": o.store.ID()}},
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	resp, err := g.call(ctx, "create_vm", r.AgentID, stemcell, g.cfg.CloudProperties, g.cfg.Networks, nil, env)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err() // shutting down: recovered on the next start
		}
		r.LastError = err.Error()
		return errors.Join(fmt.Errorf("create_vm for %s: %w", r.Name, err), g.destroy(ctx, r, "create_vm failed"))
	}
	cid, err := vmCID(resp.Result)
	if err != nil {
		return errors.Join(err, g.destroy(ctx, r, "create_vm answer unreadable"))
	}
	r.VMCID, r.State, r.StateAt = cid, store.Idle, o.now()
	if err := o.store.Save(r); err != nil {
		return err
	}
	o.metrics.spawnLatency.WithLabelValues(g.cfg.Name).Observe(time.Since(start).Seconds())
	o.log.Info("runner created", "group", g.cfg.Name, "runner", r.Name, "vm", cid, "for_job", r.TriggerJob,
		"took", time.Since(start).Round(time.Millisecond))
	return nil
}

// vmCID reads create_vm's result: "cid" (API v1) or [cid, networks] (v2).
func vmCID(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil && s != "" {
		return s, nil
	}
	var arr []json.RawMessage
	if json.Unmarshal(raw, &arr) == nil && len(arr) > 0 && json.Unmarshal(arr[0], &s) == nil && s != "" {
		return s, nil
	}
	return "", fmt.Errorf("create_vm answered %s, not a VM CID", clip(string(raw)))
}

func clip(s string) string {
	if len(s) > 120 {
		return s[:120] + "..."
	}
	return s
}

// stemcell returns the group's stemcell CID, uploading the image once and
// remembering its CID in the store (keyed by image content and cloud
// properties).
func (g *group) stemcell(ctx context.Context) (string, error) {
	sc := g.cfg.Stemcell
	if sc.CID != "" {
		return sc.CID, nil
	}
	g.o.stemcellMu.Lock()
	defer g.o.stemcellMu.Unlock()
	cpi := g.cfg.cpiConfig(g.o.cfg.CPI)
	key, err := stemcellKey(cpi.Path+"|"+cpi.Config, sc)
	if err != nil {
		return "", err
	}
	if cid, ok, err := g.o.store.Stemcell(key); err != nil || ok {
		return cid, err
	}
	props := sc.CloudProperties
	if props == nil {
		props = map[string]any{}
	}
	resp, err := g.call(ctx, "create_stemcell", sc.Image, props)
	if err != nil {
		return "", fmt.Errorf("create_stemcell %s: %w", sc.Image, err)
	}
	var cid string
	if err := json.Unmarshal(resp.Result, &cid); err != nil || cid == "" {
		return "", fmt.Errorf("create_stemcell answered %s", clip(string(resp.Result)))
	}
	g.o.log.Info("stemcell uploaded", "image", sc.Image, "cid", cid)
	return cid, g.o.store.PutStemcell(key, cid)
}

func stemcellKey(cpi string, sc StemcellConfig) (string, error) {
	h := sha256.New()
	f, err := os.Open(sc.Image)
	if err != nil {
		return "", fmt.Errorf("stemcell image: %w", err)
	}
	defer f.Close()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("stemcell image: %w", err)
	}
	props, _ := json.Marshal(sc.CloudProperties)
	h.Write(props)
	h.Write([]byte(cpi))
	return hex.EncodeToString(h.Sum(nil)), nil
}

// sweep runs the slower checks: has_vm per runner, the forge's runner
// list (registration ids, ephemeral runners the forge already removed,
// offline registrations of runners we deleted), and VMs of this group
// that no runner row accounts for.
func (g *group) sweep(ctx context.Context) error {
	o := g.o
	if err := o.store.Check(); err != nil {
		return err
	}
	runners, err := o.store.Active(g.cfg.Name)
	if err != nil {
		return err
	}
	var errs []error
	live := map[string]store.Runner{}
	for _, r := range runners {
		live[r.Name] = r
	}
	vms, err := g.listVMs(ctx)
	if err != nil {
		return err
	}
	vmState := map[string]string{}
	for _, vm := range vms {
		vmState[vm.AgentID] = vm.State
	}
	for _, r := range runners {
		if (r.State != store.Idle && r.State != store.Busy) || r.VMCID == "" {
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
				reason = "runner process exited (" + st + ")"
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
			errs = append(errs, g.destroy(ctx, r, reason))
			continue
		}
		r.VMCheckedAt = o.now()
		live[r.Name] = r
		errs = append(errs, o.store.Save(r))
	}
	registered, err := g.forge.client.Runners(ctx, g.scope)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("forge %s runners: %w", g.cfg.Forge, err))...)
	}
	atForge := map[string]forge.Runner{}
	for _, fr := range registered {
		atForge[fr.Name] = fr
		if _, ok := live[fr.Name]; ok || fr.Status != "offline" {
			continue
		}
		// Only registrations this orchestrator made and already retired.
		if row, err := o.store.Get(fr.Name); err == nil && row.Group == g.cfg.Name && row.State == store.Deleted {
			if err := g.forge.client.DeleteRunner(ctx, g.scope, fr.ID); err != nil {
				errs = append(errs, err)
			} else {
				o.log.Info("removed offline registration", "group", g.cfg.Name, "runner", fr.Name, "id", fr.ID)
			}
		}
	}
	for _, r := range live {
		if r.State != store.Idle {
			continue
		}
		fr, ok := atForge[r.Name]
		switch {
		case ok && r.ForgeRunnerID == 0:
			r.ForgeRunnerID = fr.ID
			errs = append(errs, o.store.Save(r))
		case !ok && r.ForgeRunnerID != 0:
			// It registered, and the forge removed it: an ephemeral
			// runner goes once its one job is done.
			errs = append(errs, g.destroy(ctx, r, "runner left the forge after its job"))
		}
	}
	foreign := 0
	for _, vm := range vms {
		if _, ok := live[vm.AgentID]; ok {
			continue
		}
		// Only VMs this store made are its strays. Others of the group
		// (an older store's, after runway.db was lost) may be live
		// runners: they are reported, never deleted.
		if vm.Tags["runway_store"] != o.store.ID() {
			foreign++
			if g.reportForeign(vm.CID) {
				o.log.Warn("a VM of this group was made by another state store: left alone (delete it with runway call delete_vm if it is not in use)",
					"group", g.cfg.Name, "vm", vm.CID, "agent_id", vm.AgentID, "store", vm.Tags["runway_store"])
			}
			continue
		}
		g.mu.Lock()
		flying := g.inflight[vm.AgentID]
		g.mu.Unlock()
		if flying {
			continue
		}
		o.log.Warn("deleting a VM no runner accounts for", "group", g.cfg.Name, "vm", vm.CID, "agent_id", vm.AgentID)
		_, err := g.call(ctx, "delete_vm", vm.CID)
		var ce *rpc.Error
		if err != nil && !(errors.As(err, &ce) && ce.Type == rpc.TypeVMNotFound) {
			errs = append(errs, err)
		}
	}
	o.metrics.foreignVMs.WithLabelValues(g.cfg.Name).Set(float64(foreign))
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

type listedVM struct {
	CID     string            `json:"cid"`
	AgentID string            `json:"agent_id"`
	State   string            `json:"state"`
	Tags    map[string]string `json:"tags"`
}

func (g *group) hasVM(ctx context.Context, cid string) (bool, error) {
	resp, err := g.call(ctx, "has_vm", cid)
	if err != nil {
		return false, fmt.Errorf("has_vm %s: %w", cid, err)
	}
	var exists bool
	if err := json.Unmarshal(resp.Result, &exists); err != nil {
		return false, fmt.Errorf("has_vm answered %s", clip(string(resp.Result)))
	}
	return exists, nil
}

// listVMs lists this orchestrator's VMs of the group (nil when the CPI
// has no list_vms).
func (g *group) listVMs(ctx context.Context) ([]listedVM, error) {
	resp, err := g.call(ctx, "list_vms", map[string]string{"director": g.o.cfg.CPI.DirectorUUID, "runway_group": g.cfg.Name})
	var ce *rpc.Error
	if errors.As(err, &ce) && ce.Type == rpc.TypeNotImplemented {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list_vms: %w", err)
	}
	var vms []listedVM
	if err := json.Unmarshal(resp.Result, &vms); err != nil {
		return nil, fmt.Errorf("list_vms answer: %v", err)
	}
	return vms, nil
}
