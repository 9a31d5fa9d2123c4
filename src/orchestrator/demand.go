package orchestrator

import (
	"context"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// demand is where a group's jobs come from, one input of its plan: its
// share of the forge's job listing (demand: queue) or its scale set's
// messages (demand: scale_set, scaleSetGroup). The pass plans with
// either alike.
type demand interface {
	// start begins, under lead (this process's lead of the group), what
	// must run while it acts; stop ends it.
	start(lead context.Context)
	stop()
	// sync applies the group's config before a pass.
	sync(ctx context.Context, c config.GroupConfig) error
	// finished are the runners whose job is done. Read before the
	// listing: a runner taken as finished has its job done there too.
	finished(now time.Time) map[string]bool
	// listing is the jobs: those queued for the group (owned), and those
	// running, by runner.
	listing(ctx context.Context, now time.Time) (listing, error)
	// forget drops a reaped runner from finished.
	forget(runner string)
	// client is the forge client that registers and removes runners.
	client() forge.Client
}

// queueDemand is a group's share of its forge scope's job listing,
// cached and shared by the groups that watch the scope.
type queueDemand struct {
	fv        *forgeView
	scope     forge.Scope
	maxAge    func() time.Duration // how old the listing may be
	partition func(*forgeView, *scopeJobs) listing
}

func (queueDemand) start(context.Context)                          {}
func (queueDemand) stop()                                          {}
func (queueDemand) sync(context.Context, config.GroupConfig) error { return nil }

func (q queueDemand) finished(now time.Time) map[string]bool { return q.fv.finishedRunners(now) }
func (q queueDemand) forget(runner string)                   { q.fv.forgetRunner(runner) }
func (q queueDemand) client() forge.Client                   { return q.fv.api() }

func (q queueDemand) listing(ctx context.Context, now time.Time) (listing, error) {
	sj, err := q.fv.jobs(ctx, q.scope, q.maxAge(), now)
	if err != nil {
		return listing{}, err
	}
	return q.partition(q.fv, sj), nil
}
