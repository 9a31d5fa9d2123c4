package forgetest

import (
	"cmp"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/forge"
)

// GitHubJob is a job as the GitHub contract server holds it.
type GitHubJob struct {
	ID, RunID  int64
	Repo       string
	Labels     []string
	Status     string
	Conclusion string
	RunnerID   int64
	RunnerName string
	// Created, Started, Completed: GitHub's created_at, started_at (the
	// queue time for a queued job, as GitHub's examples show it) and
	// completed_at (null until then), at the API's second precision.
	Created, Started, Completed time.Time
	// RequestID is the job's runner request id (what scale set messages
	// name it by); ScaleSet the scale set that acquired it (0: none),
	// Acquired when.
	RequestID int64
	ScaleSet  int
	Acquired  time.Time
	// UUID is the job's jobId in scale set messages (its identity on
	// github.com, where the request id is sent as 0); Assignments counts
	// its assignments to a scale set (more than one: taken back).
	UUID        string
	Assignments int
	// RunnerOnline: when the runner that took it first called in.
	RunnerOnline time.Time
}

type ghRunner struct {
	ID     int64
	Name   string
	Labels []string
	Scope  string
	Secret string
	Job    int64
	// Connected: the runner has called in. A JIT runner exists from
	// generate-jitconfig on, "offline" until it connects (GitHub's list).
	Connected bool
	// ScaleSet: a scale set's runner (it takes only that set's jobs).
	ScaleSet int
	// Online: when it first called in.
	Online time.Time
}

// GitHub is the REST + webhook contract server for GitHub Actions: runs
// and jobs listings, JIT configs, registration tokens, runners, and
// `workflow_job` deliveries signed with X-Hub-Signature-256.
type GitHub struct {
	server[GitHubJob]
	APIToken string
	// JITDisabled makes generate-jitconfig answer 404, as on servers
	// without JIT support, so clients fall back to registration tokens.
	JITDisabled bool
	// Archived repositories are listed with archived: true.
	Archived map[string]bool

	runners map[int64]*ghRunner
	nextID  int64
	rate    rateLimit
	actions actionsService
	apps    appService
	agents  map[string]int // User-Agent → requests
}

// NewGitHub starts a server on 127.0.0.1.
func NewGitHub(apiToken string) *GitHub {
	g := &GitHub{APIToken: apiToken, runners: map[int64]*ghRunner{}, nextID: 5000,
		Archived: map[string]bool{}, actions: newActionsService(), apps: newAppService(), agents: map[string]int{}}
	g.start(g.serve, gitHubDeliveries())
	return g
}

// AddJob queues a job in a run of its own and delivers its `queued`
// webhook.
func (g *GitHub) AddJob(repo string, labels []string) int64 { return g.AddJobInRun(repo, 0, labels) }

// AddJobInRun queues a job in run (0: a new run of its own).
func (g *GitHub) AddJobInRun(repo string, run int64, labels []string) int64 {
	g.mu.Lock()
	g.nextID++
	if run == 0 {
		run = g.nextID + 100000
	}
	g.actions.nextReq++
	j := &GitHubJob{ID: g.nextID, RunID: run, Repo: repo, Labels: labels, Status: "queued", Created: time.Now(),
		RequestID: g.actions.nextReq, UUID: randUUID()}
	g.jobs[j.ID] = j
	g.actionsChanged() // a scale set's long poll offers it
	g.mu.Unlock()
	g.deliver(j, "queued")
	return j.ID
}

// SetJobStatus moves a job (in_progress, completed) and delivers it.
func (g *GitHub) SetJobStatus(id int64, status string) {
	g.mu.Lock()
	j := g.jobs[id]
	j.Status = status
	switch status {
	case "in_progress":
		j.Started = time.Now()
	case "completed":
		j.Conclusion, j.Completed = "success", time.Now()
	}
	g.mu.Unlock()
	g.deliver(j, status)
}

// Completed tells whether every job of ids is completed (a test waits
// for it).
func (g *GitHub) Completed(ids ...int64) bool {
	return allCompleted(ids, func(id int64) string { return g.Job(id).Status })
}

// RunnerCount is how many runners are registered.
func (g *GitHub) RunnerCount() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.runners)
}

// UserAgents counts the requests to the REST API and the Actions service
// by User-Agent.
func (g *GitHub) UserAgents() map[string]int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return maps.Clone(g.agents)
}

func (g *GitHub) serve(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	g.requests[r.Method+" "+r.URL.Path]++
	if !strings.HasPrefix(r.URL.Path, "/_runner/") {
		g.agents[r.Header.Get("User-Agent")]++
	}
	g.mu.Unlock()
	if strings.HasPrefix(r.URL.Path, "/_runner/") {
		g.runnerSide(w, r)
		return
	}
	if strings.HasPrefix(r.URL.Path, "/app/installations/") {
		g.installationToken(w, r)
		return
	}
	if strings.HasPrefix(r.URL.Path, actionsPrefix+"/") || strings.HasPrefix(r.URL.Path, queuePrefix) {
		g.actionsAPI(w, r)
		return
	}
	if r.URL.Path == "/actions/runner-registration" && r.Method == "POST" {
		g.runnerRegistration(w, r)
		return
	}
	switch code, msg := g.restAuth(r); code {
	case 0:
	default:
		writeJSON(w, code, map[string]string{"message": msg})
		return
	}
	g.metered(w, r, g.api)
}

// api serves the REST API for Actions (authenticated, rate limited).
func (g *GitHub) api(w http.ResponseWriter, r *http.Request) {
	p := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	var scope string
	var rest []string
	switch {
	case len(p) >= 3 && p[0] == "repos":
		scope, rest = "repos/"+p[1]+"/"+p[2], p[3:]
	case len(p) >= 2 && p[0] == "orgs":
		scope, rest = "orgs/"+p[1], p[2:]
	case len(p) >= 2 && p[0] == "enterprises":
		scope, rest = "enterprises/"+p[1], p[2:]
	default:
		writeJSON(w, 404, map[string]string{"message": "Not Found"})
		return
	}
	route := strings.Join(rest, "/")
	switch {
	case scope[:4] == "orgs" && route == "repos" && r.Method == "GET":
		g.orgRepos(w, r, strings.TrimPrefix(scope, "orgs/"))
	case route == "actions/runs" && r.Method == "GET":
		g.runs(w, r, strings.TrimPrefix(scope, "repos/"), r.URL.Query().Get("status"))
	case len(rest) == 4 && rest[0] == "actions" && rest[1] == "runs" && rest[3] == "jobs":
		run, _ := strconv.ParseInt(rest[2], 10, 64)
		g.mu.Lock()
		out := []map[string]any{}
		for _, j := range g.sortedJobs() {
			if j.RunID == run && "repos/"+j.Repo == scope {
				out = append(out, g.jobJSON(j))
			}
		}
		g.mu.Unlock()
		writeJSON(w, 200, map[string]any{"total_count": len(out), "jobs": g.page(w, r, out)})
	case len(rest) == 3 && rest[0] == "actions" && rest[1] == "jobs":
		id, _ := strconv.ParseInt(rest[2], 10, 64)
		g.serveJob(w, id, func(j *GitHubJob) bool { return "repos/"+j.Repo == scope }, g.jobJSON, "Not Found")
	case route == "actions/runners/generate-jitconfig" && r.Method == "POST":
		g.jit(w, r, scope)
	case route == "actions/runners/registration-token" && r.Method == "POST":
		g.registrationToken(w, scope)
	case route == "actions/runners" && r.Method == "GET":
		g.mu.Lock()
		out := []map[string]any{}
		var ids []int64
		for id, rn := range g.runners {
			if rn.Scope == scope {
				ids = append(ids, id)
			}
		}
		sort.Slice(ids, func(a, b int) bool { return ids[a] < ids[b] })
		for _, id := range ids {
			rn := g.runners[id]
			labels := []map[string]any{}
			for _, l := range rn.Labels {
				labels = append(labels, map[string]any{"name": l, "type": "custom"})
			}
			status := "offline"
			if rn.Connected {
				status = "online"
			}
			out = append(out, map[string]any{"id": rn.ID, "name": rn.Name, "os": "linux", "status": status,
				"busy": rn.Job != 0, "labels": labels})
		}
		g.mu.Unlock()
		writeJSON(w, 200, map[string]any{"total_count": len(out), "runners": g.page(w, r, out)})
	case len(rest) == 3 && rest[0] == "actions" && rest[1] == "runners" && r.Method == "DELETE":
		g.deleteRunner(w, rest[2])
	default:
		writeJSON(w, 404, map[string]string{"message": "Not Found"})
	}
}

// deleteRunner removes a runner; GitHub refuses for one running a job.
func (g *GitHub) deleteRunner(w http.ResponseWriter, idText string) {
	id, _ := strconv.ParseInt(idText, 10, 64)
	g.mu.Lock()
	rn, ok := g.runners[id]
	if ok && rn.Job != 0 {
		g.mu.Unlock()
		writeJSON(w, 422, map[string]string{"message": fmt.Sprintf("Bad request - Runner %q is still running a job", rn.Name)})
		return
	}
	delete(g.runners, id)
	g.mu.Unlock()
	if !ok {
		writeJSON(w, 404, map[string]string{"message": "Not Found"})
		return
	}
	w.WriteHeader(204)
}

func (g *GitHub) sortedJobs() []*GitHubJob {
	out := make([]*GitHubJob, 0, len(g.jobs))
	for _, j := range g.jobs {
		out = append(out, j)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

func (g *GitHub) orgRepos(w http.ResponseWriter, r *http.Request, org string) {
	g.mu.Lock()
	seen := map[string]bool{}
	out := []map[string]any{}
	for _, j := range g.sortedJobs() {
		if strings.HasPrefix(j.Repo, org+"/") && !seen[j.Repo] {
			seen[j.Repo] = true
			out = append(out, map[string]any{"full_name": j.Repo, "archived": g.Archived[j.Repo]})
		}
	}
	g.mu.Unlock()
	writeJSON(w, 200, g.page(w, r, out))
}

// runs lists runs by their derived status: in_progress while any job
// runs, queued while any is queued, else completed.
func (g *GitHub) runs(w http.ResponseWriter, r *http.Request, repo, status string) {
	g.mu.Lock()
	st := map[int64]string{}
	for _, j := range g.jobs {
		if j.Repo != repo {
			continue
		}
		switch {
		case j.Status == "in_progress":
			st[j.RunID] = "in_progress"
		case j.Status == "queued" && st[j.RunID] != "in_progress":
			st[j.RunID] = "queued"
		case st[j.RunID] == "":
			st[j.RunID] = j.Status
		}
	}
	g.mu.Unlock()
	var ids []int64
	for id, s := range st {
		if status == "" || s == status {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(a, b int) bool { return ids[a] > ids[b] }) // newest first, as GitHub lists
	out := []map[string]any{}
	for _, id := range ids {
		out = append(out, map[string]any{"id": id, "status": st[id]})
	}
	writeJSON(w, 200, map[string]any{"total_count": len(out), "workflow_runs": g.page(w, r, out)})
}

// page is GitHub's paging of a listing: per_page (default 30, at most
// 100) and page, with a Link header naming the next page.
func (g *GitHub) page(w http.ResponseWriter, r *http.Request, all []map[string]any) []map[string]any {
	q := r.URL.Query()
	per, _ := strconv.Atoi(q.Get("per_page"))
	if per < 1 {
		per = 30
	}
	per = min(per, 100)
	page, _ := strconv.Atoi(q.Get("page"))
	page = max(page, 1)
	start, end := min((page-1)*per, len(all)), min(page*per, len(all))
	if end < len(all) {
		u := *r.URL
		v := u.Query()
		v.Set("page", strconv.Itoa(page+1))
		u.RawQuery = v.Encode()
		w.Header().Set("Link", fmt.Sprintf(`<%s%s>; rel="next"`, g.URL, u.String()))
	}
	return all[start:end]
}

func (g *GitHub) jit(w http.ResponseWriter, r *http.Request, scope string) {
	if g.JITDisabled {
		writeJSON(w, 404, map[string]string{"message": "Not Found"})
		return
	}
	var req struct {
		Name          string   `json:"name"`
		RunnerGroupID int64    `json:"runner_group_id"`
		Labels        []string `json:"labels"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Name == "" || req.RunnerGroupID == 0 || len(req.Labels) == 0 {
		writeJSON(w, 422, map[string]string{"message": "Invalid request: name, runner_group_id and labels are required"})
		return
	}
	g.mu.Lock()
	for _, rn := range g.runners {
		if rn.Name == req.Name && rn.Scope == scope {
			g.mu.Unlock()
			writeJSON(w, 409, map[string]string{"message": "Already exists - A runner with the name " + req.Name + " already exists."})
			return
		}
	}
	g.nextID++
	rn := &ghRunner{ID: g.nextID, Name: req.Name, Labels: req.Labels, Scope: scope, Secret: randHex(16)}
	g.runners[rn.ID] = rn
	g.mu.Unlock()
	cfg, _ := json.Marshal(map[string]any{"url": g.URL, "runner_id": rn.ID, "secret": rn.Secret})
	writeJSON(w, 201, map[string]any{"runner": map[string]any{"id": rn.ID, "name": rn.Name, "status": "offline"},
		"encoded_jit_config": base64.StdEncoding.EncodeToString(cfg)})
}

func (g *GitHub) jobJSON(j *GitHubJob) map[string]any {
	m := map[string]any{"id": j.ID, "run_id": j.RunID, "name": fmt.Sprintf("job-%d", j.ID), "labels": j.Labels,
		"status": j.Status, "conclusion": nil, "runner_id": nil, "runner_name": nil,
		"url": fmt.Sprintf("%s/repos/%s/actions/jobs/%d", g.URL, j.Repo, j.ID)}
	if j.Conclusion != "" {
		m["conclusion"] = j.Conclusion
	}
	if j.RunnerID != 0 {
		m["runner_id"], m["runner_name"] = j.RunnerID, j.RunnerName
	}
	date := func(t time.Time) any {
		if t.IsZero() {
			return nil
		}
		return t.UTC().Format(time.RFC3339)
	}
	m["created_at"], m["started_at"], m["completed_at"] = date(j.Created), date(cmp.Or(j.Started, j.Created)), date(j.Completed)
	return m
}

func (g *GitHub) deliver(j *GitHubJob, action string) {
	g.mu.Lock()
	body, _ := json.Marshal(map[string]any{"action": action, "workflow_job": g.jobJSON(j),
		"repository": map[string]any{"full_name": j.Repo}, "sender": map[string]any{"login": "octocat"}})
	hooks := append([]hook(nil), g.hooks...)
	g.mu.Unlock()
	for _, h := range hooks {
		g.deliveries.send(h, body, map[string]string{"X-GitHub-Event": "workflow_job", "X-GitHub-Delivery": randUUID(),
			"X-Hub-Signature-256": "sha256=" + forge.Sign(h.secret, body)})
	}
}
