package orchestrator

import (
	"sync"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/store"
)

// groupDeps is everything a group uses from outside itself, handed to it
// when it is made (the daemon's are built by Orchestrator.deps): a group
// holds no pointer back to the daemon, so one can be built and driven
// alone (group_test.go).
type groupDeps struct {
	store   *store.Store
	log     logging.Fields
	redact  *logging.Redactor
	metrics *Metrics
	hist    *History
	now     func() time.Time
	// fenced says why this process may not act now (Options.Fence), or nil.
	fenced func() error
	leader leader
	// replica names this process (logs, scale-set sessions).
	replica string
	// cpi is the daemon's CPI config: a group's own extends it; its
	// director_uuid scopes list_vms.
	cpi           config.CPIConfig
	sweepInterval time.Duration
	stemcells     *stemcells // shared by the groups: one upload per image
	// event tells the config source of a runner made, deleted or failed.
	event func(group, runner, typ, msg string)
	// failure records an error on the status page's recent errors.
	failure func(group, kind string, err error)
	// observeJob records a job's times for the group whose runner ran it.
	observeJob func(j forge.Job, fromScaleSet bool)
	// firstStart: a runner's start-up time is not yet recorded (and now is).
	firstStart func(runner string) bool
	// partition splits a scope's listing among the groups that could run
	// its jobs (ownership spans groups).
	partition func(*forgeView, *scopeJobs) listing
	// ownershipChanged: a drain flag changed: jobs may change owner.
	ownershipChanged func()
	// drop removes a retired group left out of the set.
	drop func(*group)
}

// stemcells remembers the content hash of each stemcell image, under mu,
// which also makes one upload per image at a time.
type stemcells struct {
	mu     sync.Mutex
	hashes map[string]imageHash // by image path
}

// deps is what the daemon hands its groups.
func (o *Orchestrator) deps() *groupDeps {
	return &groupDeps{store: o.store, log: o.log, redact: o.redact, metrics: o.metrics, hist: &o.hist, now: o.now,
		fenced: o.fenced, leader: o.leader, replica: o.replica, cpi: o.cfg.CPI, sweepInterval: o.cfg.SweepInterval.Duration,
		stemcells: &o.stemcells, event: o.event, failure: o.Failure, observeJob: o.observeJobFrom, firstStart: o.firstStart,
		partition: o.partition, ownershipChanged: o.bumpOwnership, drop: o.dropGroup}
}
