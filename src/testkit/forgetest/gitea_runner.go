package forgetest

// The runner side of the Gitea contract server: the Connect-RPC JSON
// protocol gitea-runner speaks (Register, Declare, FetchTask, UpdateTask,
// UpdateLog), as Gitea 1.26 serves it.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// hasAll is Gitea's ActionRunner.CanMatchLabels: the runner's labels, as
// it registered them, hold every label of the job's runs-on, compared
// exactly (a runner that registered "linux:host" does not take "linux").
func hasAll(runner, job []string) bool {
	for _, l := range job {
		if !slices.Contains(runner, l) {
			return false
		}
	}
	return true
}

// runnerRPC serves the Connect-RPC JSON runner protocol.
func (g *Gitea) runnerRPC(w http.ResponseWriter, r *http.Request, method string) {
	var req map[string]any
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		connectError(w, 400, "invalid_argument", err.Error())
		return
	}
	if method == "Register" {
		g.register(w, req)
		return
	}
	g.mu.Lock()
	var rn *GiteaRunner
	for _, x := range g.runners {
		if x.UUID == r.Header.Get("x-runner-uuid") && x.Token == r.Header.Get("x-runner-token") {
			rn = x
		}
	}
	if rn == nil {
		g.mu.Unlock()
		connectError(w, 401, "unauthenticated", "unregistered runner")
		return
	}
	rn.LastSeen = time.Now()
	if method == "UpdateTask" || method == "UpdateLog" {
		rn.LastActive = rn.LastSeen
	}
	var a rpcAnswer
	switch method {
	case "Declare":
		// Gitea replaces the runner's labels with the declared ones.
		if ls, ok := req["labels"].([]any); ok {
			rn.Labels = strs(ls)
		}
		a.body = map[string]any{"runner": runnerJSON(rn)}
	case "FetchTask":
		a = g.fetchTask(rn, req)
	case "UpdateTask":
		a = g.updateTask(rn, req)
	case "UpdateLog":
		a.body = map[string]any{"ackIndex": "0"}
	default:
		a = rpcAnswer{code: 404, kind: "unimplemented", body: "unknown method " + method}
	}
	g.mu.Unlock()
	if a.deliver != nil {
		g.deliver(a.deliver, a.action)
	}
	if a.code != 0 {
		connectError(w, a.code, a.kind, a.body.(string))
		return
	}
	writeJSON(w, 200, a.body)
}

// rpcAnswer is one runner RPC's answer, worked out under the server's
// lock: a body (or a Connect error: code, kind, message in body), and the
// webhook delivery it causes, sent once the lock is released.
type rpcAnswer struct {
	body    any
	code    int
	kind    string
	deliver *GiteaJob
	action  string
}

// fetchTask is Gitea 1.26's FetchTask (routers/api/actions/runner,
// services/actions/task.go): nothing new since the runner's tasksVersion,
// a disabled runner, or an ephemeral one that already has a task: no
// task; else the oldest-updated queued job it matches.
func (g *Gitea) fetchTask(rn *GiteaRunner, req map[string]any) rpcAnswer {
	known := toInt(req["tasksVersion"])
	key := g.tasksVersionKey(rn.Scope)
	if g.tasksVersions[key] == 0 {
		g.tasksVersions[key] = 1 // Gitea starts a missing counter at 1
	}
	latest := g.tasksVersions[key]
	version := strconv.FormatInt(latest, 10)
	first := rn.FirstFetch.IsZero()
	if first {
		rn.FirstFetch = time.Now()
	}
	note := func(found string) {
		if first {
			rn.FirstFound = found
		}
	}
	if known == latest || rn.Ephemeral && (rn.TaskJob != 0 || rn.TookTask) || rn.Disabled {
		note(fmt.Sprintf("no task: version %d known", known))
		return rpcAnswer{body: map[string]any{"tasksVersion": version}}
	}
	var cands []*GiteaJob
	for _, j := range g.jobs {
		if j.Status == "queued" && scopeCovers(rn.Scope, j.Repo, g.User) && hasAll(rn.Labels, j.Labels) {
			cands = append(cands, j)
		}
	}
	if len(cands) == 0 {
		note(fmt.Sprintf("no task: none of %d jobs matched at version %d", len(g.jobs), latest))
		return rpcAnswer{body: map[string]any{"tasksVersion": version}}
	}
	note("a task")
	sort.Slice(cands, func(a, b int) bool {
		if !cands[a].Updated.Equal(cands[b].Updated) {
			return cands[a].Updated.Before(cands[b].Updated)
		}
		return cands[a].ID < cands[b].ID
	})
	picked := cands[0]
	picked.Status, picked.RunnerID, picked.RunnerName, picked.Started, picked.Updated = "in_progress", rn.ID, rn.Name, time.Now(), time.Now()
	picked.RunnerRegistered, picked.RunnerFirstFetch, picked.RunnerFirstFound = rn.Registered, rn.FirstFetch, rn.FirstFound
	rn.TaskJob, rn.TookTask = picked.ID, true
	return rpcAnswer{deliver: picked, action: "in_progress",
		body: map[string]any{"task": map[string]any{"id": strconv.FormatInt(picked.ID, 10),
			"context": map[string]any{"repository": picked.Repo, "job": picked.Name}}, "tasksVersion": version}}
}

// updateTask records a task's state; a result ends the job.
func (g *Gitea) updateTask(rn *GiteaRunner, req map[string]any) rpcAnswer {
	state, _ := req["state"].(map[string]any)
	id := toInt(state["id"])
	j, ok := g.jobs[id]
	if !ok || rn.TaskJob != id {
		return rpcAnswer{code: 404, kind: "not_found", body: "task not found"}
	}
	result, _ := state["result"].(string)
	a := rpcAnswer{body: map[string]any{"state": map[string]any{"id": strconv.FormatInt(id, 10), "result": result}}}
	if result == "" || result == "RESULT_UNSPECIFIED" {
		return a
	}
	j.Status, j.Completed, j.Updated = "completed", time.Now(), time.Now()
	j.Conclusion = strings.ToLower(strings.TrimPrefix(result, "RESULT_"))
	rn.TaskJob = 0
	if rn.Ephemeral && !g.forgejo {
		// Gitea removes an ephemeral runner once its task is done
		// (models/actions: UpdateTask → DeleteEphemeralRunner); its next
		// RPC is refused as an unregistered runner. Forgejo keeps it
		// registered, and gives it no second task.
		delete(g.runners, rn.ID)
	}
	a.deliver, a.action = j, "completed"
	return a
}

func (g *Gitea) register(w http.ResponseWriter, req map[string]any) {
	token, _ := req["token"].(string)
	name, _ := req["name"].(string)
	g.mu.Lock()
	scope := ""
	for s, t := range g.regTokens {
		if t == token && token != "" {
			scope = s
		}
	}
	// Gitea answers these with plain errors: Connect's "unknown", 500.
	switch {
	case token == "" || name == "":
		g.mu.Unlock()
		connectError(w, 500, "unknown", "missing runner token, name")
		return
	case scope == "":
		g.mu.Unlock()
		connectError(w, 500, "unknown", "runner registration token not found")
		return
	}
	g.nextID++
	// Offline until its first authenticated RPC (Gitea: last_online unset).
	rn := &GiteaRunner{ID: g.nextID, UUID: randUUID(), Token: randHex(20), Name: name, Scope: scope, Registered: time.Now()}
	rn.Ephemeral, _ = req["ephemeral"].(bool)
	// Stored as sent (Gitea: AgentLabels = req.Labels).
	if ls, ok := req["labels"].([]any); ok {
		rn.Labels = strs(ls)
	}
	g.runners[rn.ID] = rn
	body := map[string]any{"runner": runnerJSON(rn)}
	g.mu.Unlock()
	writeJSON(w, 200, body)
}

func strs(vs []any) []string {
	out := []string{}
	for _, v := range vs {
		if s, ok := v.(string); ok {
			out = append(out, s)
		}
	}
	return out
}

func runnerJSON(rn *GiteaRunner) map[string]any {
	return map[string]any{"id": strconv.FormatInt(rn.ID, 10), "uuid": rn.UUID, "token": rn.Token, "name": rn.Name,
		"labels": rn.Labels, "ephemeral": rn.Ephemeral}
}

func toInt(v any) int64 {
	switch t := v.(type) {
	case float64:
		return int64(t)
	case string:
		n, _ := strconv.ParseInt(t, 10, 64)
		return n
	}
	return 0
}

func connectError(w http.ResponseWriter, code int, kind, msg string) {
	writeJSON(w, code, map[string]string{"code": kind, "message": msg})
}
