package forgetest

import (
	"encoding/json"
	"net/http"
	"sort"
	"strconv"
	"time"
)

// The runner endpoints of Gitea's REST API (routers/api/v1/shared/runners.go).

// restRunner is a runner as the REST API shows it: online when seen in
// the last minute, busy when active in the last 10 s.
func restRunner(rn *GiteaRunner) map[string]any {
	status := "offline"
	if time.Since(rn.LastSeen) < time.Minute {
		status = "online"
	}
	labels := []map[string]any{}
	for i, l := range rn.Labels {
		labels = append(labels, map[string]any{"id": i, "name": l, "type": "custom"})
	}
	return map[string]any{"id": rn.ID, "name": rn.Name, "status": status,
		"busy": status == "online" && time.Since(rn.LastActive) < 10*time.Second, "disabled": rn.Disabled,
		"ephemeral": rn.Ephemeral, "labels": labels}
}

func (g *Gitea) listRunners(w http.ResponseWriter, r *http.Request, scope string) {
	g.mu.Lock()
	out := []map[string]any{}
	var ids []int64
	for id, rn := range g.runners {
		if rn.Scope == scope || scope == "/admin" {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
	for _, id := range ids {
		rn := g.runners[id]
		if r.URL.Query().Get("disabled") == "true" && !rn.Disabled {
			continue
		}
		out = append(out, restRunner(rn))
	}
	g.mu.Unlock()
	writeJSON(w, 200, map[string]any{"runners": out, "total_count": len(out)})
}

// editRunner is PATCH <scope>/actions/runners/{id}: Gitea 1.26's
// EditActionRunnerOption, {"disabled": bool}.
func (g *Gitea) editRunner(w http.ResponseWriter, r *http.Request, scope, idText string) {
	id, _ := strconv.ParseInt(idText, 10, 64)
	var opt struct {
		Disabled *bool `json:"disabled"`
	}
	if err := json.NewDecoder(r.Body).Decode(&opt); err != nil || opt.Disabled == nil {
		writeJSON(w, 422, map[string]string{"message": "disabled is required"})
		return
	}
	g.mu.Lock()
	rn, ok := g.runners[id]
	if !ok || (rn.Scope != scope && scope != "/admin") {
		g.mu.Unlock()
		writeJSON(w, 404, map[string]string{"message": "Runner not found"})
		return
	}
	rn.Disabled = *opt.Disabled
	body := restRunner(rn)
	g.mu.Unlock()
	writeJSON(w, 200, body)
}

// deleteRunner is DELETE <scope>/actions/runners/{id}. Gitea removes a
// runner running a task too (the task is lost until the zombie-task
// cleanup): such removals are counted for tests.
func (g *Gitea) deleteRunner(w http.ResponseWriter, scope, idText string) {
	id, _ := strconv.ParseInt(idText, 10, 64)
	g.mu.Lock()
	rn, ok := g.runners[id]
	if ok && (rn.Scope == scope || scope == "/admin") {
		if rn.TaskJob != 0 {
			g.removedRunning = append(g.removedRunning, rn.Name)
		}
		delete(g.runners, id)
	} else {
		ok = false
	}
	g.mu.Unlock()
	if !ok {
		writeJSON(w, 404, map[string]string{"message": "Runner not found"})
		return
	}
	w.WriteHeader(204)
}
