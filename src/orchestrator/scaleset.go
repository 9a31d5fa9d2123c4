package orchestrator

// Groups whose demand comes from a GitHub runner scale set
// (groups[].demand: scale_set): the acting replica keeps the scale set's
// message session (src/forge/scaleset's listener) while it leads the
// group; the group's passes plan with what the messages said — no REST
// job listing — and register runners from the scale set.

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/scaleset"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/store"
)

// scaleSetGroup is a scale-set group's client and listener, and the
// listener's run while this process acts for the group.
type scaleSetGroup struct {
	group    string           // the group's name
	fv       *forgeView       // the group's forge
	sets     *scaleset.Client // its scale sets
	listener *scaleset.Listener
	api      *scaleset.Forge

	mu     sync.Mutex
	lead   context.Context    // the lead context the listener runs under
	cancel context.CancelFunc // ends that run
	done   chan struct{}      // closed when it has ended (its session deleted)
}

// ScaleSetStatus is a scale-set group's part of /api/v1/groups, with
// the statistics the Actions service reports (what ARC's listener
// exports as gha_*).
type ScaleSetStatus struct {
	Name              string `json:"name"`
	ID                int    `json:"id,omitempty"`
	Session           bool   `json:"session"`
	AvailableJobs     int    `json:"available_jobs"`
	AssignedJobs      int    `json:"assigned_jobs"`
	RunningJobs       int    `json:"running_jobs"`
	RegisteredRunners int    `json:"registered_runners"`
	BusyRunners       int    `json:"busy_runners"`
	IdleRunners       int    `json:"idle_runners"`
	DesiredRunners    int    `json:"desired_runners"`
	RefusedMessages   int    `json:"refused_messages,omitempty"`
	DroppedMessages   int    `json:"dropped_messages,omitempty"`
	// Paused: no session while the group can hold no job (drained,
	// retiring). Flow: how the service hands out jobs, as seen ("assign":
	// github.com; "acquire": GHES up to 3.19).
	Paused    bool   `json:"paused,omitempty"`
	Flow      string `json:"flow,omitempty"`
	LastError string `json:"last_error,omitempty"`
	// Warning: what the service does that limits the group (its labels
	// dropped).
	Warning string `json:"warning,omitempty"`
}

// scaleSetSpec is the scale set a group wants: its name (default the
// group's), runner group (default the forge's) and label names.
func scaleSetSpec(gc config.GroupConfig, fc config.ForgeConfig) scaleset.Spec {
	name := gc.ScaleSet.Name
	if name == "" {
		name = gc.Name
	}
	rg := gc.ScaleSet.RunnerGroupID
	if rg == 0 {
		rg = fc.RunnerGroupID
	}
	return scaleset.Spec{Name: name, RunnerGroupID: int(rg), Labels: forge.LabelNames(gc.Labels)}
}

// newScaleSetGroup builds a scale-set group's client and listener.
func newScaleSetGroup(dep *groupDeps, g *group, gc config.GroupConfig) (*scaleSetGroup, error) {
	fc := g.forge.cur.Load()
	if fc.scaleSets == nil {
		return nil, fmt.Errorf("group %s: forge %s serves no scale sets (a GitHub forge does)", gc.Name, fc.cfg.Name)
	}
	c, err := fc.scaleSets(g.scope)
	if err != nil {
		return nil, fmt.Errorf("group %s: %w", gc.Name, err)
	}
	ss := &scaleSetGroup{sets: c, group: gc.Name, fv: g.forge}
	ss.listener = scaleset.NewListener(scaleset.ListenerConfig{Client: c, Spec: scaleSetSpec(gc, fc.cfg), Owner: sessionOwner(dep.replica),
		MaxJobs: func() int {
			c := g.cfg()
			if c.Retire || g.isDrained() {
				return 0
			}
			return c.MaxActiveRunners
		},
		Leading: func(ctx context.Context) bool {
			ok, err := dep.leader.Lead(ctx, gc.Name)
			return ok && err == nil
		},
		Record: sessionRecord{store: dep.store, group: gc.Name}, Changed: g.wake, OnJob: g.scaleSetJob, Log: dep.log, Now: dep.now,
		OnDrop: func(reason string, err error) {
			dep.metrics.scaleSetDropped.WithLabelValues(gc.Name, reason).Inc()
			dep.failure(gc.Name, "scale set", err)
		}})
	ss.api = &scaleset.Forge{L: ss.listener, REST: g.forge.api}
	return ss, nil
}

// sessionOwner names this process's sessions: the host and the replica.
func sessionOwner(replica string) string {
	host, _ := os.Hostname()
	return strings.TrimPrefix(host+"-", "-") + "runway-" + replica
}

// sessionRecord keeps a group's session id in the store, where a replica
// taking over (or this daemon after a crash) finds it.
type sessionRecord struct {
	store *store.Store
	group string
}

func (r sessionRecord) key() string { return "scale_set_session/" + r.group }

// LoadSession implements scaleset.SessionRecord.
func (r sessionRecord) LoadSession() (int, string, error) {
	v, err := r.store.Meta(r.key())
	if err != nil || v == "" {
		return 0, "", err
	}
	idText, session, _ := strings.Cut(v, " ")
	id, _ := strconv.Atoi(idText)
	return id, session, nil
}

// SaveSession implements scaleset.SessionRecord.
func (r sessionRecord) SaveSession(id int, session string) error {
	if session == "" {
		return r.store.SetMeta(r.key(), "")
	}
	return r.store.SetMeta(r.key(), strconv.Itoa(id)+" "+session)
}

// start runs the group's listener under lead (the context of this
// process's lead of the group) unless it runs already; a run under an
// earlier lead is waited for first (its session deleted).
func (ss *scaleSetGroup) start(lead context.Context) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.lead == lead && ss.done != nil {
		return
	}
	if ss.done != nil {
		ss.cancel()
		<-ss.done
	}
	ctx, cancel := context.WithCancel(lead)
	done := make(chan struct{})
	ss.lead, ss.cancel, ss.done = lead, cancel, done
	go func() {
		defer close(done)
		ss.listener.Run(ctx)
	}()
}

// stop ends the listener's run and waits for its session to be deleted.
func (ss *scaleSetGroup) stop() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.done != nil {
		ss.cancel()
		<-ss.done
		ss.lead, ss.cancel, ss.done = nil, nil, nil
	}
}

// listing is what the group's plan counts: the jobs the scale set holds
// as the messages said, by runner; the demand a count (a scale set's
// runner takes any of its jobs: no runner is made for one job in
// particular).
func (ss *scaleSetGroup) listing(context.Context, time.Time) (listing, error) {
	st := ss.listener.State()
	jobs := map[int64]forge.Job{}
	running := map[string]forge.Job{}
	for id, j := range st.Running {
		fj := j.Job(forge.StatusInProgress)
		jobs[id], running[j.RunnerName] = fj, fj
	}
	for id, j := range st.Queued {
		jobs[id] = j.Job(forge.StatusQueued)
	}
	return listing{jobs: jobs, running: running, owned: map[string][]forge.Job{ss.group: make([]forge.Job, st.Demand())}}, nil
}

// scaleSetJob records a started or completed job's times.
func (g *group) scaleSetJob(j scaleset.JobMessage) {
	status := forge.StatusInProgress
	if j.Kind == scaleset.JobCompleted {
		status = forge.StatusCompleted
	}
	g.dep.observeJob(j.Job(status), true)
}

// sync sets the scale set's labels when the group's changed.
func (ss *scaleSetGroup) sync(ctx context.Context, c config.GroupConfig) error {
	spec := scaleSetSpec(c, ss.fv.conf())
	if err := ss.listener.SetSpec(ctx, spec); err != nil {
		return fmt.Errorf("setting scale set %s's labels: %w", spec.Name, err)
	}
	ss.listener.Nudge() // resumed, or max_active_runners raised: say so now
	return nil
}

// scaleSetStatus is the group's scale set as /api/v1/groups shows it,
// and its gauges. Desired runners are what the planner plans (the busy
// ones and, unless drained, max(waiting jobs, min_idle): planTarget), not
// ARC's min_idle + assigned.
func (g *group) scaleSetStatus(busy int, drained bool) *ScaleSetStatus {
	st := g.ss.listener.State()
	c := g.cfg()
	want := busy // drained or retiring: the runners it lets finish, no more
	if !drained {
		want += planTarget(&c.GroupConfig, st.Demand())
	}
	desired := min(c.MaxActiveRunners, want)
	s := &ScaleSetStatus{Name: g.ss.listener.Spec().Name, ID: st.ScaleSetID, Session: st.Session, Paused: st.Paused, Flow: st.Flow,
		AvailableJobs: st.Stats.TotalAvailableJobs, AssignedJobs: st.Stats.TotalAssignedJobs, RunningJobs: st.Stats.TotalRunningJobs,
		RegisteredRunners: st.Stats.TotalRegisteredRunners, BusyRunners: st.Stats.TotalBusyRunners, IdleRunners: st.Stats.TotalIdleRunners,
		DesiredRunners: desired, RefusedMessages: st.Refused, DroppedMessages: st.Dropped,
		LastError: g.dep.redact.Redact(st.LastError), Warning: g.dep.redact.Redact(st.Warning)}
	g.dep.metrics.scaleSet(c.Name, s)
	return s
}

// client is the scale set's forge client.
func (ss *scaleSetGroup) client() forge.Client { return ss.api }

// finished are the runners whose job is done, as the messages said.
func (ss *scaleSetGroup) finished(time.Time) map[string]bool {
	out := map[string]bool{}
	for name := range ss.listener.State().Finished {
		out[name] = true
	}
	return out
}

// forget drops a reaped runner from what says it finished.
func (ss *scaleSetGroup) forget(name string) { ss.listener.ForgetRunner(name) }

// deleteScaleSet deletes a retired scale-set group's scale set: GitHub
// would otherwise go on routing jobs to it (ARC deletes its scale set
// with its resource).
func (g *group) deleteScaleSet(ctx context.Context) error {
	if g.ss == nil {
		return nil
	}
	id, err := g.ss.listener.ScaleSetID(ctx)
	if err == nil {
		err = g.ss.sets.Delete(ctx, id)
	}
	if err != nil {
		return fmt.Errorf("deleting the retired group's scale set: %w", err)
	}
	g.dep.log.Info("scale set deleted", "group", g.cfg().Name, "scale_set", g.ss.listener.Spec().Name, "id", id)
	return nil
}
