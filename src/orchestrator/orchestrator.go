// Package orchestrator keeps ephemeral CI runners matched to the job queues
// of Gitea and GitHub. It is a CPI caller like the BOSH Director: every VM
// is made and removed by running bin/cpi (through cpiclient), never by
// importing a driver. Its state lives in a SQLite store (or PostgreSQL,
// shared by replicas) so that a restart loses track of nothing.
package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gofrs/flock"

	"github.com/runway-cpi/runway/src/cpiclient"
	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/scaleset"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/store"
)

// CPI is one CPI executable (cpiclient.Client in production).
type CPI interface {
	Call(ctx context.Context, method, requestID string, args ...any) (*cpiclient.Response, error)
}

// Orchestrator is the daemon.
type Orchestrator struct {
	cfg     *config.Config
	store   *store.Store
	log     logging.Fields
	redact  *logging.Redactor
	metrics *Metrics
	now     func() time.Time
	lock    *flock.Flock
	leader  leader // who acts for each group
	replica string // this process, in notifications to the others

	// The forges and groups, replaced at run time by Replace: read them
	// with forgeMap and groupList.
	setMu    sync.RWMutex
	forges   map[string]*forgeView
	groups   []*group
	newForge func(config.ForgeConfig) (Forge, error)
	cpiOpt   CPI               // Options.CPI (tests)
	events   func(RunnerEvent) // Options.Events
	fence    func() error      // Options.Fence
	takeOver bool              // Options.TakeOver
	runCtx   context.Context   // set by Run: new groups' loops start under it
	loops    sync.WaitGroup    // the groups' loops

	stemcells stemcells
	gdeps     *groupDeps // what the groups are made with (deps)

	ownMu  sync.Mutex
	ownGen int // bumped when a drain flag changes: ownership may move

	hist History // what the status page shows of the last hour

	deliveryMu    sync.Mutex
	deliveries    map[string]bool // webhook deliveries seen (bounded)
	deliveryOrder []string

	timedMu sync.Mutex
	timed   map[int64]uint8 // jobs whose queue (1) and run (2) times are recorded
	started map[string]bool // runners whose start-up time is recorded
}

// Forge is one configured forge as the daemon uses it.
type Forge struct {
	Client forge.Client
	// Secret is the webhook secret's current value ("" or nil: every
	// delivery is refused).
	Secret func() string
	// Budget is the forge's rate limit as its answers state it (nil:
	// none known); listings wait while it is low.
	Budget *forge.RateBudget
	// ScaleSets builds a client of the scope's runner scale sets (GitHub;
	// nil: the forge has none) on the forge's token and metrics.
	ScaleSets func(forge.Scope) (*scaleset.Client, error)
}

// Options are the parts tests and benchmarks replace.
type Options struct {
	CPI CPI // default: cpiclient for cfg.CPI
	// Logger and the Redactor its lines pass through (default: stderr at
	// the config's log_level); the daemon registers its secrets with it.
	Logger   logging.Logger
	Redactor *logging.Redactor
	// Forges are the configured forges by name, their clients built by
	// the caller (cmd/runway: forge.Transport, gitea.New, github.New).
	Forges map[string]Forge
	// Metrics, when set, are the series the forges' transports report to.
	Metrics *Metrics
	Now     func() time.Time
	// NewForge builds the client of a forge Forges lacks: a forge that
	// Replace adds or changes.
	NewForge func(config.ForgeConfig) (Forge, error)
	// Events, when set, hears of each runner made, deleted or failed.
	Events func(RunnerEvent)
	// Fence, when set, says whether this process may still act (the
	// Kubernetes controller: it holds the Lease as of a recent renewal).
	// An error stops every side effect — CPI calls, forge changes, store
	// writes — and every group's acting, until it answers nil again.
	Fence func() error
	// TakeOver: this process was chosen as the one to act by an outside
	// lease; other replicas' leadership sessions (PostgreSQL) are stale,
	// and Run ends them before acting (a frozen old leader's session
	// would otherwise hold its groups).
	TakeOver bool
}

// New opens the state store (taking the state dir's lock, so two daemons
// never manage the same runners) and builds the groups.
func New(cfg *config.Config, opt Options) (*Orchestrator, error) {
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("state_dir: %w", err)
	}
	lk := flock.New(filepath.Join(cfg.StateDir, "orchestrator.lock"))
	ok, err := lk.TryLock()
	if err != nil {
		return nil, fmt.Errorf("state_dir lock: %w", err)
	}
	if !ok {
		return nil, fmt.Errorf("state_dir %s is in use by another runway serve", cfg.StateDir)
	}
	logger, redact := opt.Logger, opt.Redactor
	if logger == nil {
		level, err := logging.Level(cfg.LogLevel)
		if err != nil {
			lk.Unlock()
			return nil, err
		}
		logger, redact = logging.New(level, os.Stderr)
	}
	if redact == nil {
		redact = &logging.Redactor{}
	}
	o := &Orchestrator{cfg: cfg, log: logging.Fields{Logger: logger, Tag: "orchestrator"}, redact: redact,
		forges: map[string]*forgeView{}, now: opt.Now, lock: lk, metrics: opt.Metrics, replica: randHex(6)}
	if o.metrics == nil {
		o.metrics = NewMetrics()
	}
	if o.now == nil {
		o.now = time.Now
	}
	if err := o.openStore(); err != nil {
		lk.Unlock()
		return nil, err
	}
	o.newForge, o.cpiOpt, o.events, o.fence, o.takeOver = opt.NewForge, opt.CPI, opt.Events, opt.Fence, opt.TakeOver
	o.store.SetFence(o.fenced)
	o.gdeps = o.deps()
	for _, fc := range cfg.Forges {
		f, ok := opt.Forges[fc.Name]
		if !ok || f.Client == nil {
			var err error
			if f, err = o.buildForge(fc); err != nil {
				o.Close()
				return nil, err
			}
		}
		o.forges[fc.Name] = o.forgeView(fc, f)
	}
	for _, gc := range cfg.Groups {
		g, err := o.buildGroup(gc)
		if err != nil {
			o.Close()
			return nil, err
		}
		o.groups = append(o.groups, g)
	}
	return o, nil
}

// buildForge makes a forge's client with Options.NewForge.
func (o *Orchestrator) buildForge(fc config.ForgeConfig) (Forge, error) {
	if o.newForge == nil {
		return Forge{}, fmt.Errorf("forge %s: no client", fc.Name)
	}
	f, err := o.newForge(fc)
	if err == nil && f.Client == nil {
		err = errors.New("no client")
	}
	if err != nil {
		return Forge{}, fmt.Errorf("forge %s: %w", fc.Name, err)
	}
	return f, nil
}

func (o *Orchestrator) forgeView(fc config.ForgeConfig, f Forge) *forgeView {
	fv := newForgeView(fc, f, o.observeJob)
	fv.log = o.log.Warn
	return fv
}

// buildGroup makes a group of this orchestrator (its forge must be in
// o.forges), its drain flag read from the store.
func (o *Orchestrator) buildGroup(gc config.GroupConfig) (*group, error) {
	drained, err := o.store.Drained(gc.Name)
	if err != nil {
		return nil, err
	}
	var cpi CPI = cpiFor(gc.EffectiveCPI(o.cfg.CPI))
	if o.cpiOpt != nil {
		cpi = o.cpiOpt
	}
	return newGroup(o.gdeps, gc, o.forges[gc.Forge], cpi, drained)
}

// newGroup makes a group from its dependencies, its forge and its CPI.
func newGroup(dep *groupDeps, gc config.GroupConfig, fv *forgeView, cpi CPI, drained bool) (*group, error) {
	g := &group{dep: dep, forge: fv, cpi: cpi, scope: gc.ForgeScope(), kick: make(chan struct{}, 1),
		done: make(chan struct{}), inflight: map[string]bool{}, spawnedAt: map[string]time.Time{}, drained: drained}
	g.setConf(gc)
	g.demand = queueDemand{fv: fv, scope: g.scope, maxAge: g.pollInterval, partition: dep.partition}
	if gc.Demand == config.DemandScaleSet {
		var err error
		if g.ss, err = newScaleSetGroup(dep, g, gc); err != nil {
			return nil, err
		}
		g.demand = g.ss
	}
	return g, nil
}

// groupList is the current groups.
func (o *Orchestrator) groupList() []*group {
	o.setMu.RLock()
	defer o.setMu.RUnlock()
	return append([]*group(nil), o.groups...)
}

// forgeMap is the current forges by name.
func (o *Orchestrator) forgeMap() map[string]*forgeView {
	o.setMu.RLock()
	defer o.setMu.RUnlock()
	m := make(map[string]*forgeView, len(o.forges))
	for n, fv := range o.forges {
		m[n] = fv
	}
	return m
}

func cpiFor(c config.CPIConfig) *cpiclient.Client {
	cl := &cpiclient.Client{Path: c.Path, ConfigPath: c.Config, DirectorUUID: c.DirectorUUID, APIVersion: 2,
		StemcellAPIVersion: c.StemcellAPIVersion, Timeout: c.Timeout.Duration}
	if h, p := os.Getenv("KUBERNETES_SERVICE_HOST"), os.Getenv("KUBERNETES_SERVICE_PORT"); h != "" && p != "" {
		// In a pod: the Director's cleared environment, plus the API's
		// address the Kubernetes driver's in-cluster config reads.
		cl.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR=" + os.TempDir(), "HOME=" + os.Getenv("HOME"),
			"KUBERNETES_SERVICE_HOST=" + h, "KUBERNETES_SERVICE_PORT=" + p}
	}
	return cl
}

// Close releases the store, the groups' leadership and the lock.
func (o *Orchestrator) Close() error {
	o.leader.Close()
	err := o.store.Close()
	o.lock.Unlock()
	return err
}

// Store exposes the state (for the HTTP API and tests).
func (o *Orchestrator) Store() *store.Store { return o.store }

// Run reconciles every group until ctx ends. Groups run independently: a
// slow forge or CPI stalls only its own groups.
func (o *Orchestrator) Run(ctx context.Context) error {
	if o.takeOver {
		o.endStaleLeaders(ctx)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); o.checkAccess(ctx) }()
	o.setMu.Lock()
	o.runCtx = ctx
	for _, g := range o.groups {
		o.startLoop(g)
	}
	o.setMu.Unlock()
	defer o.loops.Wait()
	wg.Add(1)
	go func() { defer wg.Done(); o.sweepLoop(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); o.listen(ctx) }()
	<-ctx.Done()
	wg.Wait()
	return nil
}

// Kick asks every group of forge that can see repo for an immediate pass,
// after a delivery from that forge: it is up, so a group backing off
// because the forge failed stops waiting too.
func (o *Orchestrator) Kick(forgeName, repo string) int {
	n := 0
	for _, g := range o.groupList() {
		if g.cfg().Forge == forgeName && (repo == "" || g.scope.Covers(repo)) {
			g.wake()
			n++
		}
	}
	return n
}

// group looks a group up by name.
func (o *Orchestrator) group(name string) *group {
	for _, g := range o.groupList() {
		if g.cfg().Name == name {
			return g
		}
	}
	return nil
}

// SetDrained stops (or resumes) spawning for a group; persisted.
func (o *Orchestrator) SetDrained(name string, drained bool) (GroupStatus, error) {
	g := o.group(name)
	if g == nil {
		return GroupStatus{}, fmt.Errorf("no group %q", name)
	}
	if err := o.store.SetDrained(name, drained); err != nil {
		return GroupStatus{}, err
	}
	g.mu.Lock()
	g.drained = drained
	g.mu.Unlock()
	o.bumpOwnership()
	o.log.Info("group drain changed", "group", name, "drained", drained)
	g.wake()
	o.relay(relayed{Group: name})
	return g.Status(), nil
}

// Groups returns every group's status.
func (o *Orchestrator) Groups() []GroupStatus {
	groups := o.groupList()
	out := make([]GroupStatus, 0, len(groups))
	for _, g := range groups {
		out = append(out, g.Status())
	}
	return out
}

// Metrics are the daemon's Prometheus series.
func (o *Orchestrator) Metrics() *Metrics { return o.metrics }

// sweepLoop drops old history rows now and then.
func (o *Orchestrator) sweepLoop(ctx context.Context) {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		if n, err := o.store.Purge(o.now().Add(-o.cfg.History.Duration)); err != nil {
			o.log.Warn("purging history", "err", err)
		} else if n > 0 {
			o.log.Info("purged history", "rows", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
