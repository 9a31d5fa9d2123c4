package scaleset

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	boshlog "github.com/cloudfoundry/bosh-utils/logger"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
	"github.com/runway-cpi/runway/src/testkit/testlog"
)

// memRecord is a SessionRecord in memory.
type memRecord struct {
	mu      sync.Mutex
	set     int
	session string
}

func (m *memRecord) LoadSession() (int, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.set, m.session, nil
}

func (m *memRecord) SaveSession(set int, session string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.set, m.session = set, session
	return nil
}

// harness runs one listener against the contract server.
type harness struct {
	t       *testing.T
	g       *forgetest.GitHub
	c       *Client
	l       *Listener
	rec     *memRecord
	maxJobs atomic.Int32
	changed chan struct{}
	stop    context.CancelFunc
	done    chan struct{}
	log     *testlog.Buffer // the listener's
	drops   atomic.Int32
}

func newHarness(t *testing.T, g *forgetest.GitHub, maxJobs int) *harness {
	h := &harness{t: t, g: g, c: newClient(t, g, org), rec: &memRecord{}, changed: make(chan struct{}, 1), log: &testlog.Buffer{}}
	h.c.cfg.Actions.Retry.Budget = 300 * time.Millisecond
	h.maxJobs.Store(int32(maxJobs))
	logger, _ := logging.New(boshlog.LevelInfo, h.log)
	h.l = NewListener(ListenerConfig{Client: h.c, Spec: Spec{Name: "runway-linux", RunnerGroupID: 1, Labels: []string{"linux"}},
		Owner: "test", MaxJobs: func() int { return int(h.maxJobs.Load()) }, Leading: func(context.Context) bool { return true },
		Record: h.rec, Log: logging.Fields{Logger: logger, Tag: "test"},
		Changed: func() {
			select {
			case h.changed <- struct{}{}:
			default:
			}
		}, OnDrop: func(string, error) { h.drops.Add(1) }, MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond})
	return h
}

// flows runs a test against each flow the service speaks.
func flows(t *testing.T, test func(t *testing.T, g *forgetest.GitHub)) {
	for _, f := range []forgetest.ActionsFlow{forgetest.FlowGitHubCom, forgetest.FlowGHES} {
		t.Run(f.String(), func(t *testing.T) {
			g := newServer(t)
			g.SetActionsFlow(f)
			test(t, g)
		})
	}
}

func (h *harness) start() {
	ctx, cancel := context.WithCancel(context.Background())
	h.stop, h.done = cancel, make(chan struct{})
	go func() { defer close(h.done); h.l.Run(ctx) }()
	h.t.Cleanup(func() { h.stop(); <-h.done })
}

// listening is a harness started and holding its session, and its state then.
func listening(t *testing.T, g *forgetest.GitHub, maxJobs int) (*harness, State) {
	h := newHarness(t, g, maxJobs)
	h.start()
	return h, h.until("a session", func(s State) bool { return s.Session })
}

// until waits, at most 20 s, for cond, looking again whenever the
// listener reports a change.
func (h *harness) until(what string, cond func(State) bool) State {
	h.t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(50 * time.Millisecond) // server-side changes the listener does not report
	defer tick.Stop()
	for {
		if s := h.l.State(); cond(s) {
			return s
		}
		select {
		case <-h.changed:
		case <-tick.C:
		case <-deadline.C:
			h.t.Fatalf("never: %s (state %+v, server %+v)", what, h.l.State(), h.g.ActionsStats())
		}
	}
}

// The listener takes only what the group can start: with room for two,
// two of five jobs (GHES: acquired; github.com: assigned as far as each
// poll's capacity leaves room); as one is done, one more.
func TestListenerAcquiresOnlyWhatItCanStart(t *testing.T) { flows(t, acquiresOnlyWhatItCanStart) }

func acquiresOnlyWhatItCanStart(t *testing.T, g *forgetest.GitHub) {
	h, _ := listening(t, g, 2)
	var jobs []int64
	for range 5 {
		jobs = append(jobs, g.AddJob("acme/app", []string{"linux"}))
	}
	s := h.until("two jobs acquired", func(s State) bool { return len(s.Queued) == 2 })
	if s.Demand() != 2 {
		t.Errorf("demand %d; want 2", s.Demand())
	}
	acquired := 0
	for _, id := range jobs {
		if g.Job(id).ScaleSet != 0 {
			acquired++
		}
	}
	if acquired != 2 {
		t.Fatalf("%d jobs acquired at the service; want 2 (room for two)", acquired)
	}
	jit, err := h.c.GenerateJIT(ctxT(t), s.ScaleSetID, "runner-1")
	if err != nil {
		t.Fatal(err)
	}
	r := runnerOf(t, jit)
	r.call(t, "acquire")
	h.until("the job started", func(s State) bool { return len(s.Running) == 1 })
	r.call(t, "complete")
	s = h.until("one more acquired once one is done", func(s State) bool {
		return len(s.Queued) == 2 && len(s.Running) == 0 && len(s.Finished) == 1
	})
	if _, ok := s.Finished["runner-1"]; !ok {
		t.Errorf("finished runners %v; want runner-1", s.Finished)
	}
	if st := g.ActionsStats(); st.AcquiredTwice != 0 || st.SessionsOpened != 1 {
		t.Errorf("server saw %+v; want no job asked for twice, one session", st)
	}
}

// A session the group's dead listener left (recorded) is deleted and the
// scale set's session opened again; one held by a listener that is not
// the group's is never touched: the listener says so and waits.
func TestListenerTakesOverOnlyItsGroupsSession(t *testing.T) {
	g := newServer(t)
	_, _, set, foreign := orgSession(t, g, "runway-linux", "someone-else")
	h := newHarness(t, g, 4)
	h.start()
	h.until("the conflict reported", func(s State) bool { return strings.Contains(s.LastError, "held by another listener") })
	g.AddJob("acme/app", []string{"linux"})
	h.until("a few more tries", func(State) bool { return g.ActionsStats().Conflicts >= 3 })
	if st := g.ActionsStats(); st.Acquires != 0 || st.Assigned != 0 {
		t.Fatalf("took a job while another listener held the scale set: %+v", st)
	}
	// The foreign session is now this group's (as if a replica of it had
	// opened it and died): recorded, it is deleted and taken over.
	h.rec.SaveSession(set.ID, foreign.ID())
	s := h.until("the job acquired after the takeover", func(s State) bool { return s.Session && len(s.Queued) == 1 })
	if s.LastError != "" {
		t.Errorf("last error %q after opening", s.LastError)
	}
	if _, id, _ := h.rec.LoadSession(); id == foreign.ID() || id == "" {
		t.Errorf("recorded session %q; want the new one", id)
	}
}

// The Actions service down for a while: the listener keeps trying on its
// session and takes the job queued meanwhile once it is back, once.
func TestListenerWaitsOutTheServiceBeingDown(t *testing.T) {
	g := newServer(t)
	h, _ := listening(t, g, 4)
	g.SetActionsDown(true)
	h.until("the outage noticed", func(s State) bool { return s.LastError != "" })
	job := g.AddJob("acme/app", []string{"linux"})
	g.SetActionsDown(false)
	h.until("the job acquired", func(s State) bool { return len(s.Queued) == 1 && s.LastError == "" })
	if g.Job(job).ScaleSet == 0 {
		t.Error("the service does not show the job acquired")
	}
	if st := g.ActionsStats(); st.AcquiredTwice != 0 {
		t.Errorf("%+v: a job asked for twice", st)
	}
}

// Hostile messages: one too big to read (its id unknown) makes the
// listener open a new session; one of another kind is deleted and
// counted; a JobAvailable again for a job already acquired is not asked
// for again. Real jobs still flow.
func TestListenerRefusesHostileMessages(t *testing.T) {
	g := newGHES(t)
	h, s := listening(t, g, 4)
	huge := append([]byte(`{"messageId": 100, "messageType": "RunnerScaleSetJobMessages", "body": "`), make([]byte, MaxMessageBytes)...)
	g.InjectMessage(s.ScaleSetID, huge)
	h.until("a second session", func(State) bool { return g.ActionsStats().SessionsOpened == 2 })
	g.InjectMessage(s.ScaleSetID, rawMessage(200, "SomethingElse", "", zeroStats))
	h.until("the odd message refused", func(s State) bool { return s.Refused == 2 && s.Session })
	job := g.AddJob("acme/app", []string{"linux"})
	h.until("the job acquired", func(s State) bool { return len(s.Queued) == 1 })
	g.RedeliverAvailable(job)
	g.AddJob("acme/app", []string{"linux"})
	h.until("the next job acquired", func(s State) bool { return len(s.Queued) == 2 })
	if st := g.ActionsStats(); st.AcquiredTwice != 0 {
		t.Errorf("%+v: the job acquired already was asked for again", st)
	}
}

// A scale set deleted at the service (404) is found missing and made
// again; a session whose token expired mid-poll is refreshed.
func TestListenerRemakesADeletedScaleSetAndRefreshesItsToken(t *testing.T) {
	g := newServer(t)
	g.SetActionsTimes(0, 0, 300*time.Millisecond)
	h, first := listening(t, g, 4)
	g.ExpireSessionTokens()
	h.until("the token refreshed", func(State) bool { return g.ActionsStats().Refreshes == 1 })
	g.DeleteScaleSet(first.ScaleSetID)
	s := h.until("a new scale set", func(s State) bool { return s.Session && s.ScaleSetID != first.ScaleSetID })
	g.AddJob("acme/app", []string{"linux"})
	h.until("its job acquired", func(s State) bool { return len(s.Queued) == 1 })
	if sets := g.ScaleSets(); len(sets) != 1 || sets[0].ID != s.ScaleSetID {
		t.Errorf("scale sets %+v", sets)
	}
}

// Leaving (the context ends: leadership lost, shutdown) deletes the
// session and clears the record.
func TestListenerDeletesItsSessionOnExit(t *testing.T) {
	g := newServer(t)
	h, s := listening(t, g, 1)
	h.stop()
	<-h.done
	if _, id, _ := h.rec.LoadSession(); id != "" {
		t.Errorf("record %q left", id)
	}
	if _, err := h.c.OpenSession(ctxT(t), s.ScaleSetID, "next"); err != nil {
		t.Errorf("a new session after the listener left: %v", err)
	}
}

// The group's forge.Client over the listener: JIT runners of the scale
// set, jobs as the messages tell (one never heard of is in progress with
// no runner: nothing is reaped for it), removal refused while a job runs.
func TestForgeOverTheListener(t *testing.T) {
	g := newServer(t)
	h, _ := listening(t, g, 2)
	f := &Forge{L: h.l}
	ctx := ctxT(t)
	if j, _ := f.Job(ctx, forge.Job{ID: 424242}); j.Status != forge.StatusInProgress || j.RunnerName != "" {
		t.Errorf("an unknown job: %+v; want in progress with no runner", j)
	}
	g.AddJob("acme/app", []string{"linux"})
	s := h.until("acquired", func(s State) bool { return len(s.Queued) == 1 })
	var req int64
	for id := range s.Queued {
		req = id
	}
	reg, err := f.Register(ctx, org, "g-abc", nil)
	if err != nil || reg.JITConfig == "" || reg.RunnerID == 0 {
		t.Fatalf("register: %+v, %v", reg, err)
	}
	r := runnerOf(t, JIT{Encoded: reg.JITConfig})
	r.call(t, "acquire")
	h.until("started", func(s State) bool { return len(s.Running) == 1 })
	if j, _ := f.Job(ctx, forge.Job{ID: req}); j.Status != forge.StatusInProgress || j.RunnerName != "g-abc" || j.Repo != "acme/app" {
		t.Errorf("the running job: %+v", j)
	}
	if err := f.DeleteRunner(ctx, org, reg.RunnerID); !errors.Is(err, forge.ErrRunnerBusy) {
		t.Errorf("removing the busy runner: %v; want ErrRunnerBusy", err)
	}
	r.call(t, "complete")
	h.until("completed", func(s State) bool { return len(s.Finished) == 1 })
	if j, _ := f.Job(ctx, forge.Job{ID: req}); j.Status != forge.StatusCompleted {
		t.Errorf("the completed job: %+v", j)
	}
	if err := h.l.SetSpec(ctx, Spec{Labels: []string{"linux", "gpu"}}); err != nil {
		t.Fatal(err)
	}
	if sets := g.ScaleSets(); len(sets) != 1 || strings.Join(sets[0].Labels, ",") != "runway-linux,linux,gpu" {
		t.Errorf("after SetSpec: %+v", sets)
	}
}

// runway check for a scale-set group: the runner list and the admin
// connection; a token GitHub refuses is named with the permission it
// lacks.
func TestCheckNamesTheMissingPermission(t *testing.T) {
	g := newServer(t)
	h := newHarness(t, g, 1)
	f := &Forge{L: h.l, REST: func() forge.Client { return restStub{} }}
	if err := f.Check(ctxT(t), org); err != nil {
		t.Fatalf("check: %v", err)
	}
	bad := newClient(t, g, org)
	bad.cfg.REST.AuthFunc = func() string { return "Bearer wrong" }
	h.l.cfg.Client = bad
	err := f.Check(ctxT(t), org)
	if err == nil || !strings.Contains(err.Error(), "admin:org") || strings.Contains(err.Error(), "wrong") {
		t.Errorf("check with a refused token: %v; want the permission named, no token", err)
	}
}

// restStub is a REST client whose runner list is empty.
type restStub struct{ forge.Client }

func (restStub) Runners(context.Context, forge.Scope) ([]forge.Runner, error) { return nil, nil }
