package forgetest

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ssSession is a scale set's message session: its queue of messages
// (built when a poll asks, kept until deleted), the events not yet sent,
// and the jobs offered in messages not yet deleted.
type ssSession struct {
	id, owner string
	set       int
	token     string
	tokenExp  time.Time
	nextMsg   int64
	messages  []ssMessage // undeleted, oldest first
	pending   []map[string]any
	offered   map[int64]int64 // job request id → the message offering it
}

type ssMessage struct {
	id      int64
	body    []byte
	offered []int64
}

// matches reports whether scale set s can run job j: its scope covers
// the job's repository and every runs-on label is one of its labels.
func (s *ScaleSet) matches(j *GitHubJob) bool {
	inScope := s.Scope == "repos/"+j.Repo || strings.HasPrefix(j.Repo, strings.TrimPrefix(s.Scope, "orgs/")+"/")
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

// jobMessage is a job's entry in a batch. The caller holds g.mu.
func (g *GitHub) jobMessage(kind string, j *GitHubJob) map[string]any {
	owner, repo, _ := strings.Cut(j.Repo, "/")
	date := func(t time.Time) string {
		if t.IsZero() {
			return "0001-01-01T00:00:00Z"
		}
		return t.UTC().Format(time.RFC3339Nano)
	}
	m := map[string]any{"messageType": kind, "runnerRequestId": j.RequestID, "repositoryName": repo, "ownerName": owner,
		"jobId": strconv.FormatInt(j.ID, 10), "jobWorkflowRef": j.Repo + "/.github/workflows/ci.yml@refs/heads/main",
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

// event queues a job's event for its scale set's session (none open: it
// is lost, as the statistics still tell). The caller holds g.mu.
func (g *GitHub) event(kind string, j *GitHubJob) {
	if sess := g.actions.bySet[j.ScaleSet]; sess != nil {
		sess.pending = append(sess.pending, g.jobMessage(kind, j))
	}
	g.actionsChanged()
}

// openSession is POST runnerscalesets/{id}/sessions: one session per
// scale set; a second is 409 TaskAgentSessionConflictException.
func (g *GitHub) openSession(w http.ResponseWriter, r *http.Request, scope, idText string) {
	id, _ := strconv.Atoi(idText)
	var body struct {
		Owner string `json:"ownerName"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.actions.sets[id]
	if !ok || s.Scope != scope {
		actionsError(w, 404, "RunnerScaleSetNotFoundException", "no scale set "+idText)
		return
	}
	if old := g.actions.bySet[id]; old != nil {
		g.actions.stats.Conflicts++
		actionsError(w, 409, "TaskAgentSessionConflictException", "The scale set "+s.Name+" already has an active session for owner "+old.owner+".")
		return
	}
	sess := &ssSession{id: randUUID(), owner: body.Owner, set: id, offered: map[int64]int64{}}
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

// session is PATCH (refresh the token) and DELETE of a session.
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
		g.renewSession(sess)
		g.actions.stats.Refreshes++
		writeJSON(w, 200, g.sessionJSON(sess))
	case "DELETE":
		delete(g.actions.sessions, id)
		delete(g.actions.bySet, sess.set)
		g.actionsChanged()
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

// sessionByToken authenticates a message queue or acquirejobs request.
// The caller holds g.mu.
func (g *GitHub) sessionByToken(r *http.Request) (*ssSession, int) {
	tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
	for _, s := range g.actions.sessions {
		if s.token == tok {
			if !time.Now().Before(s.tokenExp) {
				g.actions.stats.Expired401++
				return nil, 401
			}
			return s, 0
		}
	}
	return nil, 401
}

// messageQueue serves GET (the long poll) and DELETE of messages.
func (g *GitHub) messageQueue(w http.ResponseWriter, r *http.Request) {
	rest := strings.TrimPrefix(r.URL.Path, queuePrefix)
	id, tail, _ := strings.Cut(rest, "/messages")
	g.mu.Lock()
	sess := g.actions.sessions[id]
	if sess == nil {
		g.mu.Unlock()
		http.Error(w, "no such session", 404)
		return
	}
	if r.Header.Get("Authorization") != "Bearer "+sess.token || !time.Now().Before(sess.tokenExp) {
		if r.Header.Get("Authorization") == "Bearer "+sess.token {
			g.actions.stats.Expired401++
		}
		g.mu.Unlock()
		http.Error(w, "the message queue token is expired or wrong", 401)
		return
	}
	if r.Method == "DELETE" {
		msgID, _ := strconv.ParseInt(strings.Trim(tail, "/"), 10, 64)
		g.deleteMessage(sess, msgID)
		g.mu.Unlock()
		w.WriteHeader(204)
		return
	}
	if c := r.Header.Get("X-ScaleSetMaxCapacity"); c != "" {
		g.actions.stats.MaxCapacity, _ = strconv.Atoi(c)
	}
	g.mu.Unlock()
	g.longPoll(w, r, sess)
}

// deleteMessage acknowledges a message; the jobs it offered and no one
// acquired may be offered again. The caller holds g.mu.
func (g *GitHub) deleteMessage(sess *ssSession, id int64) {
	for i, m := range sess.messages {
		if m.id == id {
			for _, req := range m.offered {
				delete(sess.offered, req)
			}
			sess.messages = slices.Delete(sess.messages, i, i+1)
			g.actionsChanged()
			return
		}
	}
}

// longPoll answers the first undeleted message after lastMessageId, or
// a new one when there is something to say, or waits for that until the
// poll's time is up (202).
func (g *GitHub) longPoll(w http.ResponseWriter, r *http.Request, sess *ssSession) {
	last, _ := strconv.ParseInt(r.URL.Query().Get("lastMessageId"), 10, 64)
	capacity := -1
	if c := r.Header.Get("X-ScaleSetMaxCapacity"); c != "" {
		capacity, _ = strconv.Atoi(c)
	}
	g.mu.Lock()
	timeout := time.NewTimer(g.actions.longPoll)
	g.mu.Unlock()
	defer timeout.Stop()
	for {
		g.mu.Lock()
		if g.actions.closed {
			g.mu.Unlock()
			w.WriteHeader(http.StatusAccepted)
			return
		}
		if g.actions.down {
			g.actions.stats.Unavailable++
			g.mu.Unlock()
			http.Error(w, "Service Unavailable", http.StatusServiceUnavailable)
			return
		}
		if g.actions.sessions[sess.id] != sess {
			g.mu.Unlock()
			http.Error(w, "the session is gone", 404)
			return
		}
		body := g.nextMessage(sess, last, capacity)
		wait := g.actions.changed
		g.mu.Unlock()
		if body != nil {
			w.Header().Set("Content-Type", "application/json; charset=utf-8")
			w.WriteHeader(200)
			w.Write(body)
			return
		}
		select {
		case <-wait:
		case <-timeout.C:
			w.WriteHeader(http.StatusAccepted)
			return
		case <-r.Context().Done():
			return
		}
	}
}

// nextMessage is the message to answer a poll with, or nil. The caller
// holds g.mu.
func (g *GitHub) nextMessage(sess *ssSession, last int64, capacity int) []byte {
	for _, m := range sess.messages {
		if m.id > last {
			return m.body
		}
	}
	if raw := g.actions.injected[sess.set]; len(raw) > 0 {
		g.actions.injected[sess.set] = raw[1:]
		var head struct {
			ID int64 `json:"messageId"`
		}
		if json.Unmarshal(raw[0], &head) == nil && head.ID > sess.nextMsg {
			sess.nextMsg = head.ID // later messages follow it
		}
		return raw[0]
	}
	entries := sess.pending
	sess.pending = nil
	var offered []int64
	room := len(g.jobs) + 1 // no capacity header: no bound
	if capacity >= 0 {
		room = capacity - g.statistics(sess.set)["totalAssignedJobs"] - len(sess.offered)
	}
	set := g.actions.sets[sess.set]
	for _, j := range g.sortedJobs() {
		if len(entries) >= g.actions.batch || len(offered) >= room {
			break
		}
		if j.Status == "queued" && j.ScaleSet == 0 && set.matches(j) && sess.offered[j.RequestID] == 0 {
			entries = append(entries, g.jobMessage("JobAvailable", j))
			offered = append(offered, j.RequestID)
		}
	}
	if len(entries) == 0 {
		return nil
	}
	sess.nextMsg++
	inner, _ := json.Marshal(entries)
	body, _ := json.Marshal(map[string]any{"messageId": sess.nextMsg, "messageType": "RunnerScaleSetJobMessages",
		"body": string(inner), "statistics": g.statistics(sess.set)})
	for _, req := range offered {
		sess.offered[req] = sess.nextMsg
	}
	sess.messages = append(sess.messages, ssMessage{id: sess.nextMsg, body: body, offered: offered})
	return body
}

// InjectMessage makes the next poll of the scale set's session answer
// raw as it is (a malformed or huge message, for the listener's bounds).
func (g *GitHub) InjectMessage(set int, raw []byte) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.actions.injected[set] = append(g.actions.injected[set], raw)
	g.actionsChanged()
}

// RedeliverAvailable sends a JobAvailable again for a job its scale set
// acquired already (as a message replayed after a failed delete).
func (g *GitHub) RedeliverAvailable(jobID int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if j := g.jobs[jobID]; j != nil && j.ScaleSet != 0 {
		if sess := g.actions.bySet[j.ScaleSet]; sess != nil {
			sess.pending = append(sess.pending, g.jobMessage("JobAvailable", j))
		}
		g.actionsChanged()
	}
}

// acquireJobs is POST runnerscalesets/{id}/acquirejobs with the session's
// token: each job request still available to the scale set is its now
// (once: a job acquired is no one else's), and a JobAssigned follows.
func (g *GitHub) acquireJobs(w http.ResponseWriter, r *http.Request, setText string) {
	var ids []int64
	if err := json.NewDecoder(r.Body).Decode(&ids); err != nil {
		actionsError(w, 400, "ArgumentException", "the body is a JSON array of request ids")
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	sess, code := g.sessionByToken(r)
	if sess == nil || strconv.Itoa(sess.set) != setText {
		actionsError(w, max(code, 401), "TaskAgentSessionExpiredException", "the session's token is expired or unknown")
		return
	}
	g.actions.stats.Acquires++
	set := g.actions.sets[sess.set]
	got := []int64{}
	for _, j := range g.sortedJobs() {
		if !slices.Contains(ids, j.RequestID) {
			continue
		}
		switch {
		case j.ScaleSet == sess.set:
			g.actions.stats.AcquiredTwice++
		case j.Status == "queued" && j.ScaleSet == 0 && set.matches(j):
			j.ScaleSet, j.Acquired = sess.set, time.Now()
			got = append(got, j.RequestID)
			g.event("JobAssigned", j)
		}
	}
	writeJSON(w, 200, map[string]any{"count": len(got), "value": got})
}
