package forgetest

// A scale set's message queue: the long poll, messages deleted, jobs
// assigned (github.com) or offered and acquired (GHES), assignments taken
// back.

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

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
	if r.Header.Get("Authorization") != "Bearer "+sess.token || !time.Now().Before(sess.tokenExp) || sess.expired {
		if r.Header.Get("Authorization") == "Bearer "+sess.token {
			g.actions.stats.Expired401++
		}
		g.mu.Unlock()
		http.Error(w, "the message queue token is expired or wrong", 401)
		return
	}
	if r.Method == "DELETE" {
		msgID, _ := strconv.ParseInt(strings.Trim(tail, "/"), 10, 64)
		g.deleteMessage(sess.set, msgID)
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
func (g *GitHub) deleteMessage(set int, id int64) {
	q := g.actions.queues[set]
	if q == nil {
		return
	}
	for i, m := range q.messages {
		if m.id == id {
			for _, req := range m.offered {
				delete(q.offered, req)
			}
			q.messages = slices.Delete(q.messages, i, i+1)
			g.actionsChanged()
			return
		}
	}
}

// longPoll answers the first undeleted message after lastMessageId, or
// a new one when there is something to say, or waits for that until the
// poll's time is up: 202, or on github.com every other time 200 with an
// empty body.
func (g *GitHub) longPoll(w http.ResponseWriter, r *http.Request, sess *ssSession) {
	last, _ := strconv.ParseInt(r.URL.Query().Get("lastMessageId"), 10, 64)
	capacity := -1
	if c := r.Header.Get("X-ScaleSetMaxCapacity"); c != "" {
		capacity, _ = strconv.Atoi(c)
	}
	g.mu.Lock()
	timeout := time.NewTimer(g.actions.longPoll)
	var recheck <-chan time.Time // assignments to take back are looked for
	if g.actions.assignTimeout > 0 {
		t := time.NewTicker(g.actions.assignTimeout / 4)
		defer t.Stop()
		recheck = t.C
	}
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
		if g.actions.sessions[sess.id] != sess || sess.expired {
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
		case <-recheck:
		case <-timeout.C:
			g.mu.Lock()
			g.actions.idlePolls++
			empty := g.actions.flow == FlowGitHubCom && g.actions.idlePolls%2 == 0
			if empty {
				g.actions.stats.EmptyPolls++
			}
			g.mu.Unlock()
			if empty {
				w.Header().Set("Content-Type", "application/json; charset=utf-8")
				w.WriteHeader(http.StatusOK)
				return
			}
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
	q := g.actions.queues[sess.set]
	for _, m := range q.messages {
		if m.id > last {
			return m.body
		}
	}
	if raw := g.actions.injected[sess.set]; len(raw) > 0 {
		g.actions.injected[sess.set] = raw[1:]
		var head struct {
			ID int64 `json:"messageId"`
		}
		if json.Unmarshal(raw[0], &head) == nil && head.ID > q.nextMsg {
			q.nextMsg = head.ID // later messages follow it
		}
		return raw[0]
	}
	g.reclaim()
	n := min(len(q.pending), g.actions.batch)
	entries := append([]map[string]any(nil), q.pending[:n]...)
	q.pending = q.pending[n:]
	var offered []int64
	set := g.actions.sets[sess.set]
	room := len(g.jobs) + 1 // no capacity header: no bound
	if capacity > 0 || (capacity == 0 && !(g.actions.flow == FlowGitHubCom && g.actions.zeroCapAssigns)) {
		room = capacity - g.statistics(sess.set)["totalAssignedJobs"] - len(q.offered)
	}
	for _, j := range g.sortedJobs() {
		if len(entries) >= g.actions.batch || len(offered) >= room {
			break
		}
		if j.Status != "queued" || j.ScaleSet != 0 || !set.matches(j) {
			continue
		}
		if g.actions.flow == FlowGitHubCom {
			j.ScaleSet, j.Acquired = sess.set, time.Now()
			j.Assignments++
			g.actions.stats.Assigned++
			entries = append(entries, g.jobMessage("JobAssigned", j))
			offered = append(offered, 0)
		} else if q.offered[j.RequestID] == 0 {
			entries = append(entries, g.jobMessage("JobAvailable", j))
			offered = append(offered, j.RequestID)
		}
	}
	if len(entries) == 0 {
		return nil
	}
	if g.actions.flow == FlowGitHubCom {
		offered = nil // assigned, not offered
	}
	q.nextMsg++
	inner, _ := json.Marshal(entries)
	body, _ := json.Marshal(map[string]any{"messageId": q.nextMsg, "messageType": "RunnerScaleSetJobMessages",
		"body": string(inner), "statistics": g.statistics(sess.set)})
	for _, req := range offered {
		q.offered[req] = q.nextMsg
	}
	q.messages = append(q.messages, ssMessage{id: q.nextMsg, body: body, offered: offered})
	return body
}

// reclaim takes back the jobs assigned to a scale set that none of its
// runners took in time: JobCompleted (canceled, no runner), the job
// queued again (its jobId kept) for the next poll to assign. At most
// three times a job. The caller holds g.mu.
func (g *GitHub) reclaim() {
	if g.actions.assignTimeout <= 0 {
		return
	}
	for _, j := range g.sortedJobs() {
		if j.ScaleSet == 0 || j.Status != "queued" || j.Assignments > 3 || time.Since(j.Acquired) < g.actions.assignTimeout {
			continue
		}
		m := g.jobMessage("JobCompleted", j)
		m["result"] = "canceled"
		g.eventOn(j.ScaleSet, m)
		j.ScaleSet, j.Acquired = 0, time.Time{}
		g.actions.stats.Reassigned++
	}
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
		g.eventOn(j.ScaleSet, g.jobMessage("JobAvailable", j))
	}
}

// acquireJobs is POST runnerscalesets/{id}/acquirejobs with the session's
// token: each job request still available to the scale set is its now
// (once: a job acquired is no one else's), and a JobAssigned follows. On
// github.com there is no such step: 404.
func (g *GitHub) acquireJobs(w http.ResponseWriter, r *http.Request, setText string) {
	var ids []int64
	if err := json.NewDecoder(r.Body).Decode(&ids); err != nil {
		actionsError(w, 400, "ArgumentException", "the body is a JSON array of request ids")
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if c := g.actions.failAcquire; c != 0 {
		actionsError(w, c, "VssServiceException", "acquiring failed")
		return
	}
	if g.actions.flow == FlowGitHubCom {
		g.actions.stats.AcquireNotFound++
		actionsError(w, 404, "NotFoundException", "the resource could not be found")
		return
	}
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
			j.Assignments++
			got = append(got, j.RequestID)
			g.actions.stats.Assigned++
			g.event("JobAssigned", j)
		}
	}
	writeJSON(w, 200, map[string]any{"count": len(got), "value": got})
}
