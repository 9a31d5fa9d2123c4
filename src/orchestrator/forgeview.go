package orchestrator

import (
	"context"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/scaleset"
	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// The forges as the groups see them: each scope's job listing, cached and
// shared, kept current by deliveries, and split among the groups that
// could run its jobs (one owner per job).

// owner picks the one group that claims a job among those able to run it:
// the most specific scope (repo, then org/user, then global), then the
// fewest labels (the tightest fit), then the higher priority, then the
// name. Drained and retiring groups claim nothing, so their jobs fall to
// the next group. The candidates are the groups of the forge instance
// (instance): two forges of one URL — a Gitea whose groups each bring
// their own token, as seed 001's do — see the same jobs, and one group
// claims each (else each would make a runner for it, all but one idle).
func (o *Orchestrator) owner(instance string, j forge.Job, cands []*group) *group {
	var best *group
	for _, g := range cands {
		c := g.cfg()
		if g.instance() != instance || c.Retire || g.isDrained() || !g.scope.Covers(j.Repo) || !forge.Match(j.Labels, c.labels) {
			continue
		}
		if best == nil || better(g, best) {
			best = g
		}
	}
	return best
}

func better(a, b *group) bool {
	if sa, sb := a.scope.Specificity(), b.scope.Specificity(); sa != sb {
		return sa > sb
	}
	ca, cb := a.cfg(), b.cfg()
	if la, lb := len(ca.Labels), len(cb.Labels); la != lb {
		return la < lb
	}
	if ca.Priority != cb.Priority {
		return ca.Priority > cb.Priority
	}
	return ca.Name < cb.Name
}

// forgeView is one forge: its client and a short-lived cache of each
// scope's job listing, shared by the groups that watch the same scope, and
// kept current between polls by webhook deliveries.
type forgeView struct {
	name, kind string // fixed: the forge's name and type
	cur        atomic.Pointer[forgeConf]

	mu     sync.Mutex
	scopes map[string]*scopeJobs
	// finished: runners a completed delivery named (their job is done,
	// an ephemeral runner with it), until a pass reaps them.
	finished map[string]time.Time
	observe  func(forge.Job) // a job's dates, for the timings
	lowUntil time.Time       // the reset the last "budget low" was logged for
	log      func(msg string, kv ...any)
}

// forgeConf is one version of a forge's config and the client built for
// it (Orchestrator.Replace swaps both when the config changes).
type forgeConf struct {
	cfg    config.ForgeConfig
	client forge.Client
	secret func() string // the webhook secret's current value
	budget *forge.RateBudget
	// scaleSets builds scale set clients (GitHub; nil: none).
	scaleSets func(forge.Scope) (*scaleset.Client, error)
}

// instance is the forge the view reads: its type and URL, whichever
// config names it.
func (fv *forgeView) instance() string {
	c := fv.conf()
	return c.Type + " " + strings.TrimRight(strings.ToLower(c.URL), "/")
}

// instance is the forge instance the group's jobs come from.
func (g *group) instance() string {
	if g.forge == nil {
		return g.cfg().Forge
	}
	return g.forge.instance()
}

// api is the forge's current client.
func (fv *forgeView) api() forge.Client { return fv.cur.Load().client }

// conf is the forge's current config.
func (fv *forgeView) conf() config.ForgeConfig { return fv.cur.Load().cfg }

// set makes f (built for fc) the forge's client.
func (fv *forgeView) set(fc config.ForgeConfig, f Forge) {
	secret := f.Secret
	if secret == nil {
		secret = func() string { return "" }
	}
	fv.cur.Store(&forgeConf{cfg: fc, client: f.Client, secret: secret, budget: f.Budget, scaleSets: f.ScaleSets})
}

// finishedRunners are the runners whose job a delivery said is done.
// Entries older than an hour (a runner of no group here) are dropped.
func (fv *forgeView) finishedRunners(now time.Time) map[string]bool {
	fv.mu.Lock()
	defer fv.mu.Unlock()
	out := map[string]bool{}
	for name, at := range fv.finished {
		if now.Sub(at) > time.Hour {
			delete(fv.finished, name)
			continue
		}
		out[name] = true
	}
	return out
}

// forgetRunner drops a reaped runner from finished.
func (fv *forgeView) forgetRunner(name string) {
	fv.mu.Lock()
	delete(fv.finished, name)
	fv.mu.Unlock()
}

// cheapListing: the forge's job listing is one cheap, authoritative
// request per page (Gitea; Forgejo's is one request), listed again
// whenever it may be out of date; GitHub's (runs, then their jobs, under
// a rate limit) is polled slowly and lives on webhook deltas between.
func (fv *forgeView) cheapListing() bool { return fv.kind == "gitea" || fv.kind == "forgejo" }

// removesFinishedRunners: the forge removes an ephemeral runner's
// registration itself once its job is done (Gitea's ephemeral runners,
// GitHub's JIT runners); Forgejo keeps it. Where it does, Runway does not
// spend a request removing it again: a runner that ended without a job
// leaves an offline registration, which the sweep removes.
func (fv *forgeView) removesFinishedRunners() bool { return fv.kind != "forgejo" }

// markStale makes the next pass list scope afresh (deliveries may have
// been missed: a restart, a new leader).
func (fv *forgeView) markStale(s forge.Scope) {
	fv.mu.Lock()
	sj := fv.scopes[scopeKey(s)]
	fv.mu.Unlock()
	if sj != nil {
		sj.mu.Lock()
		sj.stale = true
		sj.mu.Unlock()
	}
}

type scopeJobs struct {
	mu    sync.Mutex // one listing at a time per scope
	at    time.Time
	stale bool
	// delivered: a delivery changed the listing since it was read. On
	// Gitea that asks for a fresh listing, at most once per relistAfter:
	// a burst of deliveries is folded in as deltas meanwhile.
	delivered bool
	jobs      map[int64]forge.Job
	done      map[int64]bool // completed by webhook: a late delivery must not revive it
	gen       int            // ownership generation the partition was built for
	owned     *listing
}

// listing is one scope's jobs as the groups use them, computed once.
type listing struct {
	jobs    map[int64]forge.Job
	running map[string]forge.Job // in-progress jobs by runner name
	owned   map[string][]forge.Job
}

func newForgeView(fc config.ForgeConfig, f Forge, observe func(forge.Job)) *forgeView {
	fv := &forgeView{name: fc.Name, kind: fc.Type, scopes: map[string]*scopeJobs{}, finished: map[string]time.Time{},
		observe: observe, log: func(string, ...any) {}}
	fv.set(fc, f)
	return fv
}

// pollReserve is the share of a forge's rate limit kept for making and
// removing runners: below it, listings wait for the reset.
const pollReserve = 0.2

// budgetLow reports whether the forge's rate limit is under pollReserve
// (logged once per reset).
func (fv *forgeView) budgetLow(now time.Time) bool {
	budget := fv.cur.Load().budget
	if budget == nil {
		return false
	}
	low, reset := budget.Low(pollReserve, now)
	if low {
		fv.mu.Lock()
		first := !fv.lowUntil.Equal(reset)
		fv.lowUntil = reset
		fv.mu.Unlock()
		if first {
			fv.log("forge rate limit low: listings wait for its reset; runners are still made and removed",
				"forge", fv.name, "reset", reset)
		}
	}
	return low
}

// relistAfter is how old a Gitea listing must be before a delivery makes
// it listed again (1,000 jobs queued at once: 20 pages a listing).
const relistAfter = time.Second

func scopeKey(s forge.Scope) string { return s.Kind + "/" + s.Owner + "/" + s.Repo }

// jobs returns the scope's listing: cached if younger than the forge's
// poll interval and not marked stale by a webhook, else fetched. Errors
// are returned as is: a group never acts on a listing it did not get.
func (fv *forgeView) jobs(ctx context.Context, s forge.Scope, maxAge time.Duration, now time.Time) (*scopeJobs, error) {
	fv.mu.Lock()
	sj := fv.scopes[scopeKey(s)]
	if sj == nil {
		sj = &scopeJobs{stale: true}
		fv.scopes[scopeKey(s)] = sj
	}
	fv.mu.Unlock()
	sj.mu.Lock()
	defer sj.mu.Unlock()
	age := now.Sub(sj.at)
	if !sj.stale && age < maxAge && !(sj.delivered && age >= relistAfter) {
		return sj, nil
	}
	if sj.jobs != nil && fv.budgetLow(now) {
		// Deliveries keep the listing current meanwhile.
		return sj, nil
	}
	list, err := fv.api().Jobs(ctx, s)
	if err != nil {
		return nil, err
	}
	m := make(map[int64]forge.Job, len(list))
	for _, j := range list {
		m[j.ID] = j
		if j.Status == forge.StatusInProgress {
			fv.observe(j)
		}
	}
	sj.jobs, sj.at, sj.stale, sj.delivered, sj.owned, sj.done = m, now, false, false, nil, map[int64]bool{}
	return sj, nil
}

// apply folds a webhook delivery into every cached listing that can see
// the job. Gitea listings are cheap and authoritative, so one a delivery
// changed is also listed again once it is relistAfter old; GitHub's are
// polled slowly and live on deltas between.
func (fv *forgeView) apply(ev forge.WorkflowJobEvent) {
	fv.mu.Lock()
	defer fv.mu.Unlock()
	if ev.Action == forge.StatusCompleted && ev.Job.RunnerName != "" {
		// Its runner is done too (ephemeral): it must stop counting as
		// supply now, not when a sweep finds its process gone.
		fv.finished[ev.Job.RunnerName] = time.Now()
	}
	for key, sj := range fv.scopes {
		kind, rest, _ := strings.Cut(key, "/")
		owner, repo, _ := strings.Cut(rest, "/")
		if !(forge.Scope{Kind: kind, Owner: owner, Repo: repo}).Covers(ev.Job.Repo) {
			continue
		}
		sj.mu.Lock()
		if sj.jobs != nil {
			// Deliveries can arrive out of order: a job only moves
			// forward (queued → in_progress → completed).
			j := ev.Job
			j.Status = ev.Action
			switch prev, seen := sj.jobs[j.ID]; {
			case sj.done[j.ID]:
			case ev.Action == forge.StatusCompleted:
				delete(sj.jobs, j.ID)
				sj.done[j.ID] = true
			case ev.Action == forge.StatusInProgress:
				sj.jobs[j.ID] = j
			case ev.Action == forge.StatusQueued && !(seen && prev.Status == forge.StatusInProgress):
				sj.jobs[j.ID] = j
			case ev.Action == forge.StatusWaiting:
				delete(sj.jobs, j.ID)
			}
			sj.owned = nil
		}
		if fv.cheapListing() {
			sj.delivered = true
		}
		sj.mu.Unlock()
	}
}

// partition splits a listing into the queued jobs each group claims. It
// is computed once per listing (and ownership generation) and shared by
// every group watching the scope; jobs with the same repository and labels
// share one ownership decision.
func (o *Orchestrator) partition(fv *forgeView, sj *scopeJobs) listing {
	o.ownMu.Lock()
	gen := o.ownGen
	o.ownMu.Unlock()
	sj.mu.Lock()
	defer sj.mu.Unlock()
	if sj.owned != nil && sj.gen == gen {
		return *sj.owned
	}
	owned := map[string][]forge.Job{}
	running := map[string]forge.Job{}
	memo := map[string]*group{}
	var key strings.Builder
	for _, j := range sj.jobs {
		if j.Status == forge.StatusInProgress && j.RunnerName != "" {
			running[j.RunnerName] = j
		}
		if j.Status != forge.StatusQueued {
			continue
		}
		key.Reset()
		key.WriteString(j.Repo)
		for _, l := range j.Labels {
			key.WriteByte(0)
			key.WriteString(l)
		}
		g, ok := memo[key.String()]
		if !ok {
			g = o.owner(fv.instance(), j, o.groupList())
			memo[key.String()] = g
		}
		if g != nil {
			owned[g.cfg().Name] = append(owned[g.cfg().Name], j)
		}
	}
	for _, js := range owned {
		sort.Slice(js, func(a, b int) bool { return js[a].ID < js[b].ID })
	}
	// The webhook path replaces sj.jobs entries under sj.mu; the copy
	// handed out is the groups' own.
	jobs := make(map[int64]forge.Job, len(sj.jobs))
	for id, j := range sj.jobs {
		jobs[id] = j
	}
	sj.owned, sj.gen = &listing{jobs: jobs, running: running, owned: owned}, gen
	return *sj.owned
}
