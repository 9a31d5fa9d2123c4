package forgetest

// The Actions service's runners: JIT configs of a scale set, runners
// found by name and removed, and which job a runner calling in takes.

import (
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// scaleSetJIT is POST runnerscalesets/{id}/generatejitconfig: a runner of
// the scale set (offline until it calls in) and its encoded config.
func (g *GitHub) scaleSetJIT(w http.ResponseWriter, r *http.Request, scope, idText string) {
	id, _ := strconv.Atoi(idText)
	var body struct {
		Name string `json:"name"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Name == "" {
		actionsError(w, 400, "ArgumentException", "name is required")
		return
	}
	g.mu.Lock()
	s := g.setInScope(w, scope, idText)
	if s == nil {
		g.mu.Unlock()
		return
	}
	for _, rn := range g.runners {
		if rn.Name == body.Name && rn.Scope == scope {
			g.mu.Unlock()
			actionsError(w, 409, "AgentExistsException", "A runner named "+body.Name+" exists.")
			return
		}
	}
	g.nextID++
	rn := &ghRunner{ID: g.nextID, Name: body.Name, Labels: s.Labels, Scope: scope, Secret: randHex(16), ScaleSet: id}
	g.runners[rn.ID] = rn
	g.actionsChanged()
	g.mu.Unlock()
	cfg, _ := json.Marshal(map[string]any{"url": g.URL, "runner_id": rn.ID, "secret": rn.Secret})
	encoded := base64.StdEncoding.EncodeToString(cfg)
	g.mu.Lock()
	g.actions.issued = append(g.actions.issued, encoded, rn.Secret)
	g.mu.Unlock()
	writeJSON(w, 200, map[string]any{"runner": map[string]any{"id": rn.ID, "name": rn.Name, "runnerScaleSetId": id},
		"encodedJITConfig": encoded})
}

// agentsByName is GET agents?agentName=.
func (g *GitHub) agentsByName(w http.ResponseWriter, r *http.Request, scope string) {
	name := r.URL.Query().Get("agentName")
	g.mu.Lock()
	out := []map[string]any{}
	for _, rn := range g.runners {
		if rn.Name == name && rn.Scope == scope {
			out = append(out, map[string]any{"id": rn.ID, "name": rn.Name, "runnerScaleSetId": rn.ScaleSet})
		}
	}
	g.mu.Unlock()
	writeJSON(w, 200, map[string]any{"count": len(out), "value": out})
}

// agent is GET and DELETE agents/{id}: a runner running a job is not
// removed (JobStillRunningException).
func (g *GitHub) agent(w http.ResponseWriter, r *http.Request, scope, idText string) {
	id, _ := strconv.ParseInt(idText, 10, 64)
	g.mu.Lock()
	defer g.mu.Unlock()
	rn, ok := g.runners[id]
	if !ok || rn.Scope != scope {
		actionsError(w, 404, "AgentNotFoundException", "no runner "+idText)
		return
	}
	switch r.Method {
	case "GET":
		writeJSON(w, 200, map[string]any{"id": rn.ID, "name": rn.Name, "runnerScaleSetId": rn.ScaleSet})
	case "DELETE":
		if rn.Job != 0 {
			actionsError(w, 400, "JobStillRunningException", "runner "+rn.Name+" is running a job")
			return
		}
		delete(g.runners, id)
		g.actionsChanged()
		w.WriteHeader(204)
	default:
		actionsError(w, 405, "MethodNotAllowed", r.Method)
	}
}

// pickJob is the job a runner calling in takes: a scale set's runner the
// oldest job its scale set acquired; another runner the oldest queued
// job in its scope whose labels it has and no scale set acquired. The
// caller holds g.mu.
func (g *GitHub) pickJob(rn *ghRunner) *GitHubJob {
	if rn.Job != 0 {
		return nil
	}
	for _, j := range g.sortedJobs() {
		if j.Status != "queued" {
			continue
		}
		if rn.ScaleSet != 0 {
			if j.ScaleSet == rn.ScaleSet {
				return j
			}
			continue
		}
		inScope := rn.Scope == "repos/"+j.Repo || strings.HasPrefix(j.Repo, strings.TrimPrefix(rn.Scope, "orgs/")+"/")
		if j.ScaleSet == 0 && inScope && hasAll(rn.Labels, j.Labels) {
			return j
		}
	}
	return nil
}

// runnerSide is the stand-in for the runner protocol: acquire a job the
// JIT runner's labels satisfy, then complete it (the runner is then
// removed, as a JIT runner is).
func (g *GitHub) runnerSide(w http.ResponseWriter, r *http.Request) {
	var who struct {
		RunnerID int64  `json:"runner_id"`
		Secret   string `json:"secret"`
	}
	_ = json.NewDecoder(r.Body).Decode(&who)
	g.mu.Lock()
	rn, ok := g.runners[who.RunnerID]
	if !ok || rn.Secret != who.Secret {
		g.mu.Unlock()
		writeJSON(w, 401, map[string]string{"message": "unknown runner"})
		return
	}
	switch r.URL.Path {
	case "/_runner/acquire":
		if !rn.Connected {
			rn.Connected, rn.Online = true, time.Now()
		}
		picked := g.pickJob(rn)
		if picked == nil {
			g.mu.Unlock()
			writeJSON(w, 200, map[string]any{})
			return
		}
		picked.Status, picked.RunnerID, picked.RunnerName, picked.Started = "in_progress", rn.ID, rn.Name, time.Now()
		rn.Job, picked.RunnerOnline = picked.ID, rn.Online
		if rn.ScaleSet != 0 {
			g.event("JobStarted", picked)
		}
		g.mu.Unlock()
		g.deliver(picked, "in_progress")
		writeJSON(w, 200, map[string]any{"job_id": picked.ID})
	case "/_runner/complete":
		j := g.jobs[rn.Job]
		if j == nil {
			g.mu.Unlock()
			writeJSON(w, 409, map[string]string{"message": "no job"})
			return
		}
		j.Status, j.Conclusion, j.Completed = "completed", "success", time.Now()
		delete(g.runners, rn.ID)
		if j.ScaleSet != 0 {
			g.event("JobCompleted", j)
		}
		g.mu.Unlock()
		g.deliver(j, "completed")
		w.WriteHeader(204)
	default:
		g.mu.Unlock()
		writeJSON(w, 404, map[string]string{"message": "Not Found"})
	}
}
