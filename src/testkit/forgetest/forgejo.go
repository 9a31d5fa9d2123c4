package forgetest

// The Forgejo flavour of the contract server, from Forgejo's source
// (routers/api/v1/shared/runners.go, modules/structs/runner.go and
// action.go, services/actions/task.go, models/actions/runner.go). The
// runner protocol is Gitea's (the same Connect-RPC service); the REST API
// differs:
//
//   - POST <scope>/actions/runners {name, description, ephemeral} makes a
//     runner: 201 {id, uuid, token}. It has no labels until it declares
//     them, and is offline until its first RPC.
//   - GET <scope>/actions/runners/registration-token (GET, where Gitea
//     1.26 takes POST).
//   - GET <scope>/actions/runners: a JSON array (X-Total-Count), status
//     offline | idle | active; no disabled flag and no PATCH.
//   - GET <scope>/actions/runners/jobs[?labels=a,b]: every waiting and
//     running job, unpaginated, `null` when there is none; no repository
//     name, runner or dates. With labels, only jobs whose runs-on are
//     all among them.
//   - GET /repositories/{id}: a repository by id.
//   - No /actions/jobs listing and no workflow_job webhook.
//   - An ephemeral runner takes one task; when it is done the runner
//     stays registered (FetchTask answers no task) until it is removed.

import (
	"encoding/json"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// NewForgejo starts a Forgejo contract server on 127.0.0.1.
func NewForgejo(apiToken string) *Gitea {
	g := NewGitea(apiToken)
	g.forgejo = true
	g.repoIDs = map[string]int64{}
	return g
}

// RepoID is the id the server gives repository owner/name.
func (g *Gitea) RepoID(repo string) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.repoID(repo)
}

func (g *Gitea) repoID(repo string) int64 {
	id, ok := g.repoIDs[repo]
	if !ok {
		id = int64(len(g.repoIDs) + 1)
		g.repoIDs[repo] = id
	}
	return id
}

// IssuedTokens are the runner tokens the REST registration handed out
// (secrets: tests check they appear nowhere else).
func (g *Gitea) IssuedTokens() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.issued...)
}

// serveForgejo is Forgejo's runner API under a scope (serve split it off).
func (g *Gitea) serveForgejo(w http.ResponseWriter, r *http.Request, scope, rest string) {
	switch {
	case rest == "/actions/runners/registration-token" && r.Method == "GET":
		writeJSON(w, 200, map[string]string{"token": g.RegistrationToken(scope)})
	case rest == "/actions/runners/jobs" && r.Method == "GET":
		g.forgejoJobs(w, r, scope)
	case rest == "/actions/runners" && r.Method == "POST":
		g.forgejoRegister(w, r, scope)
	case rest == "/actions/runners" && r.Method == "GET":
		g.forgejoRunners(w, r, scope)
	case strings.HasPrefix(rest, "/actions/runners/") && r.Method == "DELETE":
		g.deleteRunner(w, scope, strings.TrimPrefix(rest, "/actions/runners/"))
	default:
		writeJSON(w, 404, map[string]string{"message": "not found"})
	}
}

func (g *Gitea) repository(w http.ResponseWriter, idText string) {
	id, _ := strconv.ParseInt(idText, 10, 64)
	g.mu.Lock()
	name := ""
	for n, i := range g.repoIDs {
		if i == id {
			name = n
		}
	}
	g.mu.Unlock()
	if name == "" {
		writeJSON(w, 404, map[string]string{"message": "repository not found"})
		return
	}
	owner, short, _ := strings.Cut(name, "/")
	writeJSON(w, 200, map[string]any{"id": id, "name": short, "full_name": name, "owner": map[string]any{"login": owner}})
}

// forgejoJobs is GetActionRunJobs: waiting (queued here) and running
// jobs of the scope, filtered by ?labels= as Forgejo does.
func (g *Gitea) forgejoJobs(w http.ResponseWriter, r *http.Request, scope string) {
	var labels []string
	if _, asked := r.URL.Query()["labels"]; asked {
		labels = strings.Split(strings.TrimSpace(r.URL.Query().Get("labels")), ",")
	}
	g.mu.Lock()
	var all []*GiteaJob
	for _, j := range g.jobs {
		if (j.Status == "queued" || j.Status == "in_progress") && scopeCovers(scope, j.Repo, g.User) {
			all = append(all, j)
		}
	}
	sort.Slice(all, func(a, b int) bool { return all[a].ID < all[b].ID })
	var out []map[string]any // null when empty, as Forgejo answers
	for _, j := range all {
		runsOn := len(labels) == 0 || labels[0] == "" && len(j.Labels) == 0 ||
			len(labels) > 0 && len(j.Labels) > 0 && hasAll(labels, j.Labels)
		if !runsOn {
			continue
		}
		status := map[string]string{"queued": "waiting", "in_progress": "running"}[j.Status]
		owner, _, _ := strings.Cut(j.Repo, "/")
		taskID := int64(0)
		if j.RunnerID != 0 {
			taskID = j.ID
		}
		out = append(out, map[string]any{"id": j.ID, "attempt": 1, "handle": strconv.FormatInt(j.ID, 16),
			"repo_id": g.repoID(j.Repo), "owner_id": int64(len(owner)), "name": j.Name, "needs": []string{},
			"runs_on": j.Labels, "task_id": taskID, "status": status, "run_id": j.RunID})
	}
	g.mu.Unlock()
	writeJSON(w, 200, out)
}

// forgejoRegister is RegisterRunner: a runner with no labels yet, offline
// until it connects with its UUID and token.
func (g *Gitea) forgejoRegister(w http.ResponseWriter, r *http.Request, scope string) {
	var opt struct {
		Name        string `json:"name"`
		Description string `json:"description"`
		Ephemeral   bool   `json:"ephemeral"`
	}
	if err := json.NewDecoder(r.Body).Decode(&opt); err != nil || opt.Name == "" {
		writeJSON(w, 422, map[string]string{"message": "[Name]: Required"})
		return
	}
	g.mu.Lock()
	g.nextID++
	rn := &GiteaRunner{ID: g.nextID, UUID: randUUID(), Token: randHex(20), Name: opt.Name, Scope: scope,
		Registered: time.Now(), Ephemeral: opt.Ephemeral}
	g.runners[rn.ID] = rn
	g.issued = append(g.issued, rn.Token)
	g.mu.Unlock()
	writeJSON(w, 201, map[string]any{"id": rn.ID, "uuid": rn.UUID, "token": rn.Token})
}

// forgejoRunners is ListRunners: an array, paginated, X-Total-Count.
func (g *Gitea) forgejoRunners(w http.ResponseWriter, r *http.Request, scope string) {
	page, _ := strconv.Atoi(r.URL.Query().Get("page"))
	page = max(page, 1)
	limit, _ := strconv.Atoi(r.URL.Query().Get("limit"))
	if limit < 1 {
		limit = 30
	}
	limit = min(limit, 50)
	g.mu.Lock()
	var ids []int64
	for id, rn := range g.runners {
		if rn.Scope == scope || scope == "/admin" {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	out := []map[string]any{}
	for i := (page - 1) * limit; i < len(ids) && i < page*limit; i++ {
		rn := g.runners[ids[i]]
		status := "offline"
		switch {
		case time.Since(rn.LastSeen) >= time.Minute:
		case time.Since(rn.LastActive) < 10*time.Second:
			status = "active"
		default:
			status = "idle"
		}
		owner, repo := int64(0), int64(0)
		if strings.HasPrefix(rn.Scope, "/repos/") {
			repo = g.repoID(strings.TrimPrefix(rn.Scope, "/repos/"))
		}
		out = append(out, map[string]any{"id": rn.ID, "uuid": rn.UUID, "name": rn.Name, "version": "", "description": "",
			"labels": append([]string{}, rn.Labels...), "status": status, "ephemeral": rn.Ephemeral, "owner_id": owner, "repo_id": repo})
	}
	total := len(ids)
	g.mu.Unlock()
	w.Header().Set("X-Total-Count", strconv.Itoa(total))
	writeJSON(w, 200, out)
}
