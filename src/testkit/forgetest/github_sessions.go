package forgetest

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ssQueue is a scale set's message stream: the messages built for a poll
// and not deleted (oldest first), the events not yet sent, and the jobs
// offered in undeleted messages. It is the scale set's, not a session's:
// a new session is answered what the last one left undeleted (its first
// poll names no lastMessageId), and events that happen while no session
// is open wait for the next one.
type ssQueue struct {
	nextMsg  int64
	messages []ssMessage
	pending  []map[string]any
	offered  map[int64]int64 // job request id → the message offering it
}

// ssSession is a scale set's message session.
type ssSession struct {
	id, owner string
	set       int
	token     string
	tokenExp  time.Time
	// expired: the service dropped the session (ExpireSessions): its
	// token is refused, refreshing it is 404, deleting it 400
	// RunnerScaleSetSessionExpiredException — and until that delete it
	// still holds the scale set (ARC #4285).
	expired bool
}

type ssMessage struct {
	id      int64
	body    []byte
	offered []int64
}

// matches reports whether scale set s can run job j: its scope covers
// the job's repository (an enterprise's covers every one) and every
// runs-on label is one of its labels.
func (s *ScaleSet) matches(j *GitHubJob) bool {
	inScope := s.Scope == "repos/"+j.Repo || strings.HasPrefix(s.Scope, "enterprises/") ||
		strings.HasPrefix(j.Repo, strings.TrimPrefix(s.Scope, "orgs/")+"/")
	return inScope && hasAll(s.Labels, j.Labels)
}

// statistics are a scale set's counts now. The caller holds g.mu.
func (g *GitHub) statistics(set int) map[string]int {
	s := g.actions.sets[set]
	st := map[string]int{"totalAvailableJobs": 0, "totalAcquiredJobs": 0, "totalAssignedJobs": 0, "totalRunningJobs": 0,
		"totalRegisteredRunners": 0, "totalBusyRunners": 0, "totalIdleRunners": 0}
	for _, j := range g.jobs {
		switch {
		case j.Status == "completed":
		case j.ScaleSet == set:
			st["totalAcquiredJobs"]++
			st["totalAssignedJobs"]++
			if j.Status == "in_progress" {
				st["totalRunningJobs"]++
			}
		case j.ScaleSet == 0 && j.Status == "queued" && s != nil && s.matches(j):
			st["totalAvailableJobs"]++
		}
	}
	for _, rn := range g.runners {
		if rn.ScaleSet == set {
			st["totalRegisteredRunners"]++
			if rn.Job != 0 {
				st["totalBusyRunners"]++
			} else if rn.Connected {
				st["totalIdleRunners"]++
			}
		}
	}
	return st
}

// jobMessage is a job's entry in a batch. On github.com the runner
// request id is 0 and jobId (a UUID) is the job's identity. The caller
// holds g.mu.
func (g *GitHub) jobMessage(kind string, j *GitHubJob) map[string]any {
	owner, repo, _ := strings.Cut(j.Repo, "/")
	date := func(t time.Time) string {
		if t.IsZero() {
			return "0001-01-01T00:00:00Z"
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	req := j.RequestID
	if g.actions.flow == FlowGitHubCom {
		req = 0
	}
	m := map[string]any{"messageType": kind, "runnerRequestId": req, "repositoryName": repo, "ownerName": owner,
		"jobId": j.UUID, "jobWorkflowRef": j.Repo + "/.github/workflows/ci.yml@refs/heads/main",
		"jobDisplayName": "job-" + strconv.FormatInt(j.ID, 10), "workflowRunId": j.RunID, "eventName": "push",
		"requestLabels": j.Labels, "queueTime": date(j.Created), "scaleSetAssignTime": date(j.Acquired),
		"runnerAssignTime": date(j.Started), "finishTime": date(j.Completed)}
	switch kind {
	case "JobAvailable":
		m["acquireJobUrl"] = g.URL + actionsPrefix + "/_apis/runtime/runnerscalesets/acquirejob"
	case "JobStarted", "JobCompleted":
		m["runnerId"], m["runnerName"] = j.RunnerID, j.RunnerName
		if kind == "JobCompleted" {
			m["result"] = "succeeded"
		}
	}
	return m
}

// event queues a job's event on its scale set's stream (sent at the next
// poll of whichever session is open then). The caller holds g.mu.
func (g *GitHub) event(kind string, j *GitHubJob) {
	g.eventOn(j.ScaleSet, g.jobMessage(kind, j))
}

func (g *GitHub) eventOn(set int, entry map[string]any) {
	if q := g.actions.queues[set]; q != nil {
		q.pending = append(q.pending, entry)
	}
	g.actionsChanged()
}

// openSession is POST runnerscalesets/{id}/sessions: one session per
// scale set; a second is 409 RunnerScaleSetSessionConflictException (the
// name ARC #4285 logged; older services answered
// TaskAgentSessionConflictException).
func (g *GitHub) openSession(w http.ResponseWriter, r *http.Request, scope, idText string) {
	id, _ := strconv.Atoi(idText)
	var body struct {
		Owner string `json:"ownerName"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	g.mu.Lock()
	defer g.mu.Unlock()
	s := g.setInScope(w, scope, idText)
	if s == nil {
		return
	}
	if old := g.actions.bySet[id]; old != nil {
		g.actions.stats.Conflicts++
		actionsError(w, 409, "RunnerScaleSetSessionConflictException", "The scale set "+s.Name+" already has an active session for owner "+old.owner+".")
		return
	}
	sess := &ssSession{id: randUUID(), owner: body.Owner, set: id}
	g.renewSession(sess)
	g.actions.sessions[sess.id], g.actions.bySet[id] = sess, sess
	g.actions.stats.SessionsOpened++
	writeJSON(w, 200, g.sessionJSON(sess))
}

// renewSession gives a session a new message queue token. The caller
// holds g.mu.
func (g *GitHub) renewSession(sess *ssSession) {
	sess.tokenExp = time.Now().Add(g.actions.sessionTTL)
	sess.token = g.actions.token(sess.tokenExp, "session "+sess.id)
	g.actions.issued = append(g.actions.issued, sess.token)
}

func (g *GitHub) sessionJSON(sess *ssSession) map[string]any {
	return map[string]any{"sessionId": sess.id, "ownerName": sess.owner, "runnerScaleSet": g.setJSON(g.actions.sets[sess.set]),
		"messageQueueUrl": g.URL + queuePrefix + sess.id + "/messages", "messageQueueAccessToken": sess.token,
		"statistics": g.statistics(sess.set)}
}

// session is PATCH (refresh the token) and DELETE of a session. An
// expired session's refresh is 404 (actions/scaleset #123: "runner
// referenced a session ID that doesn't exist"), its delete 400
// RunnerScaleSetSessionExpiredException (ARC #4285) — after which it is
// gone.
func (g *GitHub) session(w http.ResponseWriter, r *http.Request, scope, setText, id string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	sess := g.actions.sessions[id]
	if sess == nil || strconv.Itoa(sess.set) != setText || g.actions.sets[sess.set].Scope != scope {
		actionsError(w, 404, "TaskAgentSessionExpiredException", "no session "+id)
		return
	}
	switch r.Method {
	case "PATCH":
		if sess.expired {
			actionsError(w, 404, "RunnerAdminException", "runner referenced a session ID that doesn't exist in redis")
			return
		}
		g.renewSession(sess)
		g.actions.stats.Refreshes++
		writeJSON(w, 200, g.sessionJSON(sess))
	case "DELETE":
		g.actions.stats.SessionDeletes++
		delete(g.actions.sessions, id)
		delete(g.actions.bySet, sess.set)
		g.actionsChanged()
		if sess.expired {
			g.actions.stats.ExpiredDeletes++
			actionsError(w, 400, "GitHub.Actions.Runtime.WebApi.RunnerScaleSetSessionExpiredException, GitHub.Actions.Runtime.WebApi",
				"The session identifier "+id+" is not valid.")
			return
		}
		w.WriteHeader(204)
	default:
		actionsError(w, 405, "MethodNotAllowed", r.Method)
	}
}

// ExpireSessionTokens makes every message queue token expired now (the
// next request with one is 401 until the session is refreshed).
func (g *GitHub) ExpireSessionTokens() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range g.actions.sessions {
		s.tokenExp = time.Now().Add(-time.Second)
	}
	g.actionsChanged()
}

// ExpireSessions drops every open session as the service does one it
// evicted: its token is refused (401), its refresh 404, its delete 400;
// it holds its scale set until deleted.
func (g *GitHub) ExpireSessions() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range g.actions.sessions {
		s.expired = true
	}
	g.actionsChanged()
}

// OpenSessions counts the sessions open now (expired ones included).
func (g *GitHub) OpenSessions() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.actions.sessions)
}

// sessionByToken authenticates a message queue or acquirejobs request.
// The caller holds g.mu.
func (g *GitHub) sessionByToken(r *http.Request) (*ssSession, int) {
	tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	for _, s := range g.actions.sessions {
		if s.token == tok && !s.expired {
			if !time.Now().Before(s.tokenExp) {
				g.actions.stats.Expired401++
				return nil, 401
			}
			return s, 0
		}
	}
	return nil, 401
}
