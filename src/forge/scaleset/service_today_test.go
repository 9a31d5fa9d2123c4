package scaleset

// The service as its users have seen it since mid-2025 (issue 47): jobs
// known by jobId, both flows, a failing message never blocking the
// stream, empty 200 polls, expired sessions, the set's name among its
// labels, no session while the group can hold nothing.

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// runJob plays the scale set's runner for one job: it takes the job and
// (done) completes it.
func runJob(t *testing.T, h *harness, name string) runner {
	t.Helper()
	s := h.l.State()
	jit, err := h.c.GenerateJIT(ctxT(t), s.ScaleSetID, name)
	if err != nil {
		t.Fatal(err)
	}
	r := runnerOf(t, jit)
	r.call(t, "acquire")
	return r
}

// Point 1: on github.com a job's messages carry runnerRequestId 0 and
// its identity in jobId: the job is queued, runs and completes by that
// identity (its runner reaped); an assignment the service takes back
// (JobCompleted canceled, no runner) and makes again leaves it queued.
func TestJobsKnownByJobID(t *testing.T) {
	g := newServer(t)
	g.SetAssignTimeout(150 * time.Millisecond)
	h, _ := listening(t, g, 2)
	job := g.AddJob("acme/app", []string{"linux"})
	h.until("taken back and assigned again", func(State) bool { return g.ActionsStats().Reassigned >= 1 && g.Job(job).ScaleSet != 0 })
	s := h.until("queued again", func(s State) bool { return len(s.Queued) == 1 && s.Refused == 0 })
	var key int64
	for k, j := range s.Queued {
		if j.RequestID != 0 || j.JobID != g.Job(job).UUID {
			t.Fatalf("queued %+v; want the job by its jobId, request id 0", j)
		}
		key = k
	}
	g.SetAssignTimeout(0)
	r := runJob(t, h, "runner-1")
	h.until("running", func(s State) bool { _, ok := s.Running[key]; return ok && len(s.Queued) == 0 })
	f := &Forge{L: h.l}
	if j, _ := f.Job(ctxT(t), forge.Job{ID: key}); j.Status != forge.StatusInProgress || j.RunnerName != "runner-1" {
		t.Errorf("the running job as the group sees it: %+v", j)
	}
	r.call(t, "complete")
	h.until("completed, its runner finished", func(s State) bool { return len(s.Running) == 0 && !s.Finished["runner-1"].IsZero() })
	if j, _ := f.Job(ctxT(t), forge.Job{ID: key}); j.Status != forge.StatusCompleted {
		t.Errorf("the completed job: %+v", j)
	}
}

// Point 2: the flow is found out, not configured: github.com assigns
// (no acquire request is ever sent), GHES offers and the listener
// acquires.
func TestFlowFoundOut(t *testing.T) {
	flows(t, func(t *testing.T, g *forgetest.GitHub) {
		h, _ := listening(t, g, 4)
		g.AddJob("acme/app", []string{"linux"})
		s := h.until("queued", func(s State) bool { return len(s.Queued) == 1 })
		st := g.ActionsStats()
		want, acquires := FlowAssign, 0
		if g.ActionsFlow() == forgetest.FlowGHES {
			want, acquires = FlowAcquire, 1
		}
		if s.Flow != want || st.Acquires != acquires || st.AcquireNotFound != 0 {
			t.Errorf("flow %q, %d acquires (%d refused 404); want %q, %d", s.Flow, st.Acquires, st.AcquireNotFound, want, acquires)
		}
	})
}

// jobAvailable is a raw message offering a job by request id.
func jobAvailable(id, request int64) []byte {
	body, _ := json.Marshal([]map[string]any{{"messageType": "JobAvailable", "runnerRequestId": request, "jobId": "3f1b2c4d-0000-4000-8000-00000000abcd",
		"ownerName": "acme", "repositoryName": "app", "requestLabels": []string{"linux"}}})
	return rawMessage(id, messageKind, string(body), zeroStats)
}

// Point 3: a message whose handling fails never blocks the stream. On
// github.com a JobAvailable's acquire answers 404: the offer is dropped at
// once (told, counted) and the next job, assigned directly, is taken. A
// handling that keeps failing (acquire 500) is tried a bounded number of
// times, then dropped; the job it offered is offered again and taken
// once acquiring works.
func TestFailingMessagesNeverBlockTheStream(t *testing.T) {
	t.Run("acquire 404 on github.com", func(t *testing.T) {
		g := newServer(t)
		h, s := listening(t, g, 4)
		g.InjectMessage(s.ScaleSetID, jobAvailable(50, 777))
		h.until("the offer dropped", func(s State) bool { return s.Dropped == 1 })
		g.AddJob("acme/app", []string{"linux"})
		s = h.until("the next job taken", func(s State) bool { return len(s.Queued) == 1 })
		if s.Flow != FlowAssign || h.drops.Load() != 1 || g.ActionsStats().AcquireNotFound != 1 {
			t.Errorf("flow %q, %d drops told, %d acquires 404; want assign, 1, 1", s.Flow, h.drops.Load(), g.ActionsStats().AcquireNotFound)
		}
	})
	t.Run("acquire failing on GHES", func(t *testing.T) {
		g := newGHES(t)
		g.FailAcquire(500)
		h, _ := listening(t, g, 4)
		first := g.AddJob("acme/app", []string{"linux"})
		h.until("the message dropped after its tries", func(s State) bool { return s.Dropped == 1 })
		if !strings.Contains(h.log.String(), "scale set message dropped") || h.drops.Load() != 1 {
			t.Errorf("the drop is neither logged nor told")
		}
		g.FailAcquire(0)
		second := g.AddJob("acme/app", []string{"linux"})
		h.until("both jobs acquired", func(s State) bool { return len(s.Queued) == 2 })
		if g.Job(first).ScaleSet == 0 || g.Job(second).ScaleSet == 0 {
			t.Errorf("jobs %+v / %+v: want both acquired", g.Job(first), g.Job(second))
		}
	})
}

// Point 4: a long poll answered 200 with an empty body is no message: the
// session goes on, nothing is refused.
func TestEmptyPollIsNoMessage(t *testing.T) {
	g := newServer(t)
	g.SetActionsTimes(0, 0, 50*time.Millisecond)
	h, _ := listening(t, g, 1)
	h.until("a few empty 200s", func(State) bool { return g.ActionsStats().EmptyPolls >= 3 })
	g.AddJob("acme/app", []string{"linux"})
	s := h.until("the job", func(s State) bool { return len(s.Queued) == 1 })
	if st := g.ActionsStats(); st.SessionsOpened != 1 || s.Refused != 0 || s.LastError != "" {
		t.Errorf("%d sessions, %d refused, error %q; want one session, nothing refused", st.SessionsOpened, s.Refused, s.LastError)
	}
}

// Point 5: a dead listener's session the service expired answers its
// delete 400 RunnerScaleSetSessionExpiredException: it is gone, and the
// takeover opens its session at once (no error, no backoff).
func TestExpiredSessionTakenOverAtOnce(t *testing.T) {
	g := newServer(t)
	_, _, set, old := orgSession(t, g, "runway-linux", "replica-dead")
	g.ExpireSessions()
	h := newHarness(t, g, 2)
	h.rec.SaveSession(set.ID, old.ID())
	h.start()
	h.until("the session", func(s State) bool { return s.Session })
	st := g.ActionsStats()
	if st.ExpiredDeletes != 1 || st.SessionsOpened != 2 || st.Conflicts != 1 || strings.Contains(h.log.String(), "retrying") {
		t.Errorf("server %+v, log %q: want the expired session's 400 taken as gone and one open right after", st, h.log.String())
	}
	// Its own session expired under it: the delete on leaving clears the
	// record all the same.
	g.ExpireSessions()
	h.stop()
	<-h.done
	if _, id, _ := h.rec.LoadSession(); id != "" {
		t.Errorf("record %q left after deleting an expired session", id)
	}
}

// Point 6: without custom labels (GHES before 3.18) the service keeps the
// set's name only, as its answer to the set's making shows: no PATCH at
// any session's open (it would change nothing); the group is told which
// labels its jobs cannot use.
func TestDroppedLabelsNotPatchedAgain(t *testing.T) {
	g := newGHES(t)
	g.SetCustomLabels(false)
	g.SetActionsTimes(0, 0, 50*time.Millisecond)
	h, s := listening(t, g, 1)
	if !strings.Contains(s.Warning, "dropped labels linux") || !strings.Contains(s.Warning, "runs-on: runway-linux") {
		t.Errorf("warning %q; want the labels dropped named", s.Warning)
	}
	for range 3 { // new sessions, each with its Ensure
		g.ExpireSessions()
		n := g.ActionsStats().SessionsOpened
		h.until("a new session", func(State) bool { return g.ActionsStats().SessionsOpened > n })
	}
	if n := g.ActionsStats().LabelPatches; n != 0 {
		t.Errorf("%d label PATCHes over 4 sessions; want none (the service drops them: asking changes nothing)", n)
	}
}

// Point 7: while the group can hold no job the listener holds no session
// (a session telling capacity 0 may be assigned jobs all the same); a job
// queued meanwhile stays the service's, and is taken as soon as the group
// can hold one again. Draining under an open session deletes it.
func TestNoSessionWhileTheGroupHoldsNothing(t *testing.T) {
	g := newServer(t)
	g.SetActionsTimes(0, 0, 30*time.Second)
	h := newHarness(t, g, 0)
	h.start()
	h.until("paused", func(s State) bool { return s.Paused })
	job := g.AddJob("acme/app", []string{"linux"})
	if n := g.OpenSessions(); n != 0 || g.Job(job).ScaleSet != 0 {
		t.Fatalf("drained: %d sessions, job %+v; want no session and the job the service's", n, g.Job(job))
	}
	h.maxJobs.Store(1)
	h.l.Nudge()
	h.until("the job taken", func(s State) bool { return len(s.Queued) == 1 && !s.Paused })
	h.maxJobs.Store(0)
	h.l.Nudge() // the poll in flight told capacity 1
	h.until("paused again", func(s State) bool { return s.Paused && !s.Session })
	if n := g.OpenSessions(); n != 0 {
		t.Errorf("%d sessions open while drained", n)
	}
}

// Point 8: every request names Runway and its version.
func TestRequestsNameRunway(t *testing.T) {
	g := newServer(t)
	listening(t, g, 1)
	agents := g.UserAgents()
	if len(agents) == 0 {
		t.Fatal("no request seen")
	}
	for ua := range agents {
		if !strings.HasPrefix(ua, "runway/") || ua != forge.UserAgent() {
			t.Errorf("User-Agent %q; want %s", ua, forge.UserAgent())
		}
	}
}

// Point 8: the admin connection is tried five times, with growing waits,
// before its 401 is an error (ARC's count; a new registration token may
// not be known to the service at once).
func TestAdminConnectionTriedFiveTimes(t *testing.T) {
	for refused, ok := range map[int]bool{4: true, 5: false} {
		g := newServer(t)
		g.RefuseAdminConnections(refused)
		c := newClient(t, g, org)
		c.cfg.AdminRetryWait = time.Millisecond
		_, err := c.Ensure(ctxT(t), Spec{Name: "s", RunnerGroupID: 1, Labels: []string{"s"}})
		if (err == nil) != ok || g.Requests()["POST /actions/runner-registration"] != min(refused+1, 5) {
			t.Errorf("%d refusals: %v after %d tries; want success %v within 5", refused, err, g.Requests()["POST /actions/runner-registration"], ok)
		}
	}
}

// Point 8: an enterprise's scale set (a PAT's, as ARC and scaleset allow)
// takes jobs of any of its organizations.
func TestEnterpriseScaleSet(t *testing.T) {
	g := newServer(t)
	ent := forge.Scope{Kind: "enterprise", Owner: "acme-corp"}
	c := newClient(t, g, ent)
	if u := ConfigURL("https://github.com", ent); u != "https://github.com/enterprises/acme-corp" {
		t.Errorf("config URL %s", u)
	}
	ctx := ctxT(t)
	_, sess := linuxSession(t, ctx, c, "ent", "x")
	g.AddJob("other-org/app", []string{"linux"})
	m, err := sess.Message(ctx, 0, 1)
	if err != nil || m == nil || len(m.Assigned) != 1 || m.Assigned[0].Repo() != "other-org/app" {
		t.Fatalf("message %+v, %v; want the other organization's job assigned", m, err)
	}
	if g.Requests()["POST /enterprises/acme-corp/actions/runners/registration-token"] != 1 {
		t.Errorf("requests %v: want the enterprise's registration token", g.Requests())
	}
}
