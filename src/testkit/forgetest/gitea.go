// Package forgetest holds API contract servers for the forges the
// orchestrator talks to, built from Gitea 1.26's API (its swagger, and its
// source: docs/testing.md lists each behaviour against it), Forgejo's
// source (forgejo.go) and GitHub's REST API for Actions
// (docs.github.com/rest/actions); none of them is installable here. They are real HTTP servers on 127.0.0.1: the
// orchestrator's REST clients, its webhook endpoint and the test runner
// program talk to them exactly as they would to the real forge.
//
// Limits, written down: one API token; users own only repositories named
// <user>/...; no workflows — jobs are added by the test; runner logs
// (UpdateLog) are accepted and dropped; the GitHub server's runner side is
// a stand-in (the Actions runner protocol is not public).
package forgetest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/forge"
)

// GiteaJob is a job as the server holds it.
type GiteaJob struct {
	ID         int64
	RunID      int64
	Repo       string
	Name       string
	Labels     []string
	Status     string // queued | waiting | in_progress | completed
	Conclusion string
	RunnerID   int64
	RunnerName string
	Created    time.Time
	Started    time.Time
	Completed  time.Time
	// Updated orders the jobs a runner may pick, oldest first (Gitea:
	// CreateTaskForRunner, Asc("updated", "id")).
	Updated time.Time
	// RunnerRegistered: when the runner that took it registered;
	// RunnerFirstFetch: its first FetchTask, and what that found.
	RunnerRegistered time.Time
	RunnerFirstFetch time.Time
	RunnerFirstFound string
}

// GiteaRunner is a registered runner.
type GiteaRunner struct {
	ID   int64
	UUID string
	// Token authenticates the runner's RPCs (x-runner-token).
	Token string
	Name  string
	// Labels are stored as the runner sent them and matched exactly.
	Labels     []string
	Ephemeral  bool
	Scope      string // the API prefix of the token it registered with
	Registered time.Time
	LastSeen   time.Time // every runner RPC (Gitea: last_online)
	// LastActive: UpdateTask and UpdateLog (Gitea: last_active; "busy"
	// in the REST API is active within 10 s).
	LastActive time.Time
	TaskJob    int64
	TookTask   bool // it has had a task (an ephemeral runner gets one)
	FirstFetch time.Time
	FirstFound string // what its first FetchTask found
	Disabled   bool
}

// Gitea is the contract server.
type Gitea struct {
	server[GiteaJob]
	APIToken string
	User     string // the API token's user (for /user/... scope)
	// TokenScopes are the API token's scopes as Gitea enforces them (an
	// API category per path prefix, read for GET, write otherwise); nil
	// allows everything. Set before requests are made.
	TokenScopes []string

	runners   map[int64]*GiteaRunner
	regTokens map[string]string // scope prefix → token
	nextID    int64
	// tasksVersions grow when a job becomes runnable: the instance's
	// (""), its owner's ("owner:o") and its repository's ("repo:o/r").
	// FetchTask picks a task only for a runner whose known version of its
	// own scope's counter is another (Gitea: action_tasks_version).
	tasksVersions map[string]int64
	down          bool
	// removedRunning: runners whose registration was removed while they
	// ran a task.
	removedRunning []string
	// forgejo: the server answers as Forgejo does (forgejo.go).
	forgejo bool
	repoIDs map[string]int64
	issued  []string
}

// NewGitea starts a server on 127.0.0.1.
func NewGitea(apiToken string) *Gitea {
	g := &Gitea{APIToken: apiToken, User: "tester", runners: map[int64]*GiteaRunner{},
		regTokens: map[string]string{}, nextID: 100, tasksVersions: map[string]int64{}}
	g.start(g.serve, giteaDeliveries())
	return g
}

// SetDown makes every API answer 503 (the forge is down) or restores it.
func (g *Gitea) SetDown(down bool) {
	g.mu.Lock()
	g.down = down
	g.mu.Unlock()
}

// AddJob queues a job (status queued or waiting) in repo owner/name.
func (g *Gitea) AddJob(repo, name string, labels []string, status string) int64 {
	g.mu.Lock()
	g.nextID++
	now := time.Now()
	j := &GiteaJob{ID: g.nextID, RunID: g.nextID + 10000, Repo: repo, Name: name, Labels: labels, Status: status, Created: now, Updated: now}
	g.jobs[j.ID] = j
	if status == "queued" {
		g.bumpTasksVersion(repo)
	}
	g.mu.Unlock()
	g.deliver(j, status)
	return j.ID
}

// SetJobStatus moves a job (e.g. waiting → queued when its needs finish).
func (g *Gitea) SetJobStatus(id int64, status string) {
	g.mu.Lock()
	j := g.jobs[id]
	j.Status, j.Updated = status, time.Now()
	if status == "queued" {
		g.bumpTasksVersion(j.Repo)
	}
	g.mu.Unlock()
	g.deliver(j, status)
}

// bumpTasksVersion is Gitea's IncreaseTaskVersion for a job of repo: the
// global, owner and repository counters each grow by one.
func (g *Gitea) bumpTasksVersion(repo string) {
	owner, _, _ := strings.Cut(repo, "/")
	for _, k := range []string{"", "owner:" + owner, "repo:" + repo} {
		g.tasksVersions[k]++
	}
}

// tasksVersionKey is the counter a runner registered at scope reads
// (Gitea: GetTasksVersionByScope(runner.OwnerID, runner.RepoID)).
func (g *Gitea) tasksVersionKey(scope string) string {
	switch {
	case scope == "/user":
		return "owner:" + g.User
	case strings.HasPrefix(scope, "/orgs/"):
		return "owner:" + strings.TrimPrefix(scope, "/orgs/")
	case strings.HasPrefix(scope, "/repos/"):
		return "repo:" + strings.TrimPrefix(scope, "/repos/")
	}
	return ""
}

// Completed tells whether every job of ids is completed (a test waits
// for it).
func (g *Gitea) Completed(ids ...int64) bool {
	return allCompleted(ids, func(id int64) string { return g.Job(id).Status })
}

// Runners returns copies of the registered runners.
func (g *Gitea) Runners() []GiteaRunner {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := []GiteaRunner{}
	for _, r := range g.runners {
		out = append(out, *r)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

// RemovedWhileRunning names the runners whose registration was removed
// while they ran a task (their job is lost with it).
func (g *Gitea) RemovedWhileRunning() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.removedRunning...)
}

// RegistrationToken is POST <scope>/actions/runners/registration-token:
// the scope's token (an API prefix: /orgs/acme, /repos/acme/app, /user,
// /admin), made on first use and the same afterwards, as Gitea reuses
// an active token.
func (g *Gitea) RegistrationToken(scope string) string {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.regTokens[scope]
	if !ok {
		t = randHex(20) // 40 chars, like Gitea's
		g.regTokens[scope] = t
	}
	return t
}

func (g *Gitea) serve(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.requests[r.Method+" "+r.URL.Path]++
	down := g.down
	g.mu.Unlock()
	if down {
		writeJSON(w, 503, map[string]string{"message": "service unavailable"})
		return
	}
	if strings.HasPrefix(r.URL.Path, "/api/actions/runner.v1.RunnerService/") {
		g.runnerRPC(w, r, strings.TrimPrefix(r.URL.Path, "/api/actions/runner.v1.RunnerService/"))
		return
	}
	if !strings.HasPrefix(r.URL.Path, "/api/v1/") {
		writeJSON(w, 404, map[string]string{"message": "not found"})
		return
	}
	if r.Header.Get("Authorization") != "token "+g.APIToken {
		writeJSON(w, 401, map[string]string{"message": "token is required"})
		return
	}
	path := strings.TrimPrefix(r.URL.Path, "/api/v1")
	if id, ok := strings.CutPrefix(path, "/repositories/"); ok && g.forgejo && r.Method == "GET" {
		g.repository(w, id)
		return
	}
	if msg := g.scopeRefusal(path, r.Method); msg != "" && !g.forgejo { // the Forgejo mode models no token scopes
		writeJSON(w, 403, map[string]string{"message": msg})
		return
	}
	scope, rest, ok := splitScope(path, g.User)
	if !ok {
		writeJSON(w, 404, map[string]string{"message": "not found"})
		return
	}
	if g.forgejo {
		g.serveForgejo(w, r, scope, rest)
		return
	}
	switch {
	case rest == "/actions/jobs" && r.Method == "GET":
		g.listJobs(w, r, scope)
	case strings.HasPrefix(rest, "/actions/jobs/") && r.Method == "GET" && strings.HasPrefix(scope, "/repos/"):
		id, _ := strconv.ParseInt(strings.TrimPrefix(rest, "/actions/jobs/"), 10, 64)
		g.serveJob(w, id, func(j *GiteaJob) bool { return scopeCovers(scope, j.Repo, g.User) }, g.jobJSON, "job not found")
	case rest == "/actions/runs" && r.Method == "GET" && strings.HasPrefix(scope, "/repos/"):
		g.listRuns(w, scope)
	case rest == "/actions/runners/registration-token":
		if r.Method != "POST" {
			writeJSON(w, 404, map[string]string{"message": "not found"})
			return
		}
		writeJSON(w, 200, map[string]string{"token": g.RegistrationToken(scope)})
	case rest == "/actions/runners" && r.Method == "GET":
		g.listRunners(w, r, scope)
	case strings.HasPrefix(rest, "/actions/runners/") && r.Method == "PATCH":
		g.editRunner(w, r, scope, strings.TrimPrefix(rest, "/actions/runners/"))
	case strings.HasPrefix(rest, "/actions/runners/") && r.Method == "DELETE":
		g.deleteRunner(w, scope, strings.TrimPrefix(rest, "/actions/runners/"))
	default:
		writeJSON(w, 404, map[string]string{"message": "not found"})
	}
}

// splitScope splits /repos/o/r/..., /orgs/o/..., /user/..., /admin/...
func splitScope(p, user string) (string, string, bool) {
	parts := strings.SplitN(strings.TrimPrefix(p, "/"), "/", 4)
	switch {
	case len(parts) >= 3 && parts[0] == "repos":
		return "/repos/" + parts[1] + "/" + parts[2], "/" + strings.Join(parts[3:], "/"), len(parts) == 4
	case len(parts) >= 2 && parts[0] == "orgs":
		return "/orgs/" + parts[1], "/" + strings.Join(parts[2:], "/"), true
	case parts[0] == "user" || parts[0] == "admin":
		return "/" + parts[0], "/" + strings.Join(parts[1:], "/"), true
	}
	return "", "", false
}

// scopeRefusal is Gitea's answer to a token lacking the scope a route
// needs (checked before the route looks anything up), or "".
func (g *Gitea) scopeRefusal(path, method string) string {
	if g.TokenScopes == nil {
		return ""
	}
	category := map[string]string{"admin": "admin", "orgs": "organization", "user": "user", "repos": "repository"}[strings.SplitN(strings.TrimPrefix(path, "/"), "/", 2)[0]]
	if category == "" {
		return ""
	}
	need := "read:" + category
	if method != "GET" {
		need = "write:" + category
	}
	for _, have := range g.TokenScopes {
		if have == "all" || have == need || have == "write:"+category {
			return ""
		}
	}
	return fmt.Sprintf("token does not have at least one of required scope(s), required=[%s], token scope=%s", need, strings.Join(g.TokenScopes, ","))
}

func scopeCovers(scope, repo, user string) bool {
	owner, _, _ := strings.Cut(repo, "/")
	switch {
	case scope == "/admin":
		return true
	case scope == "/user":
		return owner == user
	case strings.HasPrefix(scope, "/orgs/"):
		return owner == strings.TrimPrefix(scope, "/orgs/")
	}
	return scope == "/repos/"+repo
}

// statusFilters is Gitea's convertToInternal (routers/api/v1/shared): a
// ?status= value → the job state it selects: a status, or a completed
// job's conclusion.
var statusFilters = map[string]string{"queued": "queued", "waiting": "waiting", "in_progress": "in_progress",
	"completed": "completed", "pending": "waiting", "requested": "waiting", "action_required": "waiting",
	"success": "completed/success", "failure": "completed/failure", "skipped": "completed/skipped",
	"neutral": "completed/skipped", "cancelled": "completed/cancelled", "timed_out": "completed/cancelled"}

func (g *Gitea) listJobs(w http.ResponseWriter, r *http.Request, scope string) {
	q := r.URL.Query()
	want := map[string]bool{}
	for _, s := range q["status"] {
		v, ok := statusFilters[s]
		if !ok {
			writeJSON(w, 400, map[string]string{"message": "Invalid status " + s})
			return
		}
		want[v] = true
	}
	page, _ := strconv.Atoi(q.Get("page"))
	if page < 1 {
		page = 1
	}
	limit, _ := strconv.Atoi(q.Get("limit"))
	if limit < 1 {
		limit = 30
	}
	limit = min(limit, 50)
	g.mu.Lock()
	var all []*GiteaJob
	for _, j := range g.jobs {
		if scopeCovers(scope, j.Repo, g.User) && (len(want) == 0 || want[j.Status] || want[j.Status+"/"+j.Conclusion]) {
			all = append(all, j)
		}
	}
	sort.Slice(all, func(a, b int) bool { return all[a].ID < all[b].ID })
	out := []map[string]any{}
	for i := (page - 1) * limit; i < len(all) && i < page*limit; i++ {
		out = append(out, g.jobJSON(all[i]))
	}
	g.mu.Unlock()
	w.Header().Set("X-Total-Count", strconv.Itoa(len(all)))
	if page*limit < len(all) {
		u := *r.URL
		v := u.Query()
		v.Set("page", strconv.Itoa(page+1))
		u.RawQuery = v.Encode()
		w.Header().Set("Link", fmt.Sprintf(`<%s%s>; rel="next"`, g.URL, u.String()))
	}
	writeJSON(w, 200, map[string]any{"jobs": out, "total_count": len(all)})
}

func (g *Gitea) listRuns(w http.ResponseWriter, scope string) {
	g.mu.Lock()
	runs := map[int64]map[string]any{}
	for _, j := range g.jobs {
		if "/repos/"+j.Repo != scope {
			continue
		}
		run, ok := runs[j.RunID]
		if !ok {
			run = map[string]any{"id": j.RunID, "status": j.Status}
			runs[j.RunID] = run
		}
		if j.Status == "queued" {
			run["status"] = "queued"
		}
	}
	g.mu.Unlock()
	out := []map[string]any{}
	for _, r := range runs {
		out = append(out, r)
	}
	writeJSON(w, 200, map[string]any{"workflow_runs": out, "total_count": len(out)})
}

// jobJSON renders a job as the REST API does: conclusion, runner_id and
// runner_name omitted until set; unset dates are the Unix epoch.
func (g *Gitea) jobJSON(j *GiteaJob) map[string]any {
	epoch := func(t time.Time) string {
		if t.IsZero() {
			return "1970-01-01T00:00:00Z"
		}
		return t.UTC().Format(time.RFC3339)
	}
	m := map[string]any{
		"id": j.ID, "url": fmt.Sprintf("%s/api/v1/repos/%s/actions/jobs/%d", g.URL, j.Repo, j.ID),
		"html_url": fmt.Sprintf("%s/%s/actions/runs/%d/jobs/0", g.URL, j.Repo, j.RunID),
		"run_id":   j.RunID, "run_url": fmt.Sprintf("%s/api/v1/repos/%s/actions/runs/%d", g.URL, j.Repo, j.RunID),
		"name": j.Name, "labels": j.Labels, "run_attempt": 0, "head_sha": "0000000000000000000000000000000000000000",
		"head_branch": "main", "status": j.Status, "steps": []any{},
		"created_at": epoch(j.Created), "started_at": epoch(j.Started), "completed_at": epoch(j.Completed),
	}
	if j.RunnerID != 0 {
		m["runner_id"], m["runner_name"], m["run_attempt"] = j.RunnerID, j.RunnerName, 1
	}
	if j.Conclusion != "" {
		m["conclusion"] = j.Conclusion
	}
	return m
}

// deliver sends a workflow_job delivery to every hook, asynchronously (as
// Gitea's hook queue does).
func (g *Gitea) deliver(j *GiteaJob, action string) {
	g.mu.Lock()
	owner, name, _ := strings.Cut(j.Repo, "/")
	payload := map[string]any{"action": action, "workflow_job": g.jobJSON(j),
		"repository":   map[string]any{"full_name": j.Repo, "name": name, "owner": map[string]any{"login": owner}},
		"organization": map[string]any{"login": owner}, "sender": map[string]any{"login": g.User}}
	hooks := append([]hook(nil), g.hooks...)
	g.mu.Unlock()
	body, _ := json.Marshal(payload)
	for _, h := range hooks {
		sig := forge.Sign(h.secret, body)
		g.deliveries.send(h, body, map[string]string{"X-Gitea-Event": "workflow_job", "X-Gitea-Event-Type": "workflow_job",
			"X-Gitea-Delivery": randUUID(), "X-Gitea-Signature": sig, "X-Hub-Signature-256": "sha256=" + sig})
	}
}
