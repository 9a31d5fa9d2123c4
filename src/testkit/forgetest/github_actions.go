package forgetest

// The GitHub contract server's Actions service: runner scale sets as
// actions-runner-controller's listener and actions/scaleset use them (read
// for facts; differences in docs/testing.md). Its state lives under g.mu
// beside the REST API's jobs and runners: a scale set's runners are
// GitHub runners (listed by the REST API), its jobs GitHub jobs.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// actionsPrefix is where the Actions service is served (the admin
// connection answers g.URL + actionsPrefix as its URL).
const actionsPrefix = "/_services/pipelines"

// queuePrefix is where message queues are served.
const queuePrefix = "/_services/broker/sessions/"

// ScaleSet is a runner scale set as the server holds it.
type ScaleSet struct {
	ID            int
	Name          string
	RunnerGroupID int
	Labels        []string
	Scope         string // orgs/x or repos/o/r
}

// actionsService is the Actions service's state (under GitHub.mu).
type actionsService struct {
	key       []byte
	regTokens map[string]string         // registration token → scope
	admins    map[string]adminToken     // admin token → its scope and expiry
	sets      map[int]*ScaleSet         // by id
	sessions  map[string]*ssSession     // by session id
	bySet     map[int]*ssSession        // the one session of a scale set
	nextSet   int                       // scale set ids
	nextReq   int64                     // runner request ids
	changed   chan struct{}             // closed and replaced on every change (long polls wait on it)
	injected  map[int][]json.RawMessage // raw messages to answer next, by scale set
	stats     ActionsStats

	// AdminTTL, SessionTTL: how long admin and message queue tokens
	// last; LongPoll: how long a poll with nothing to say waits (the
	// service answers 202 after about 50 s); Down: every Actions service
	// request answers 503.
	adminTTL, sessionTTL, longPoll time.Duration
	down                           bool
	batch                          int
	closed                         bool     // the server is closing: long polls end
	issued                         []string // JIT configs, runner secrets, session tokens
}

type adminToken struct {
	scope string
	exp   time.Time
}

// ActionsStats count what the Actions service saw.
type ActionsStats struct {
	SessionsOpened, Conflicts, Acquires, Refreshes, Expired401 int
	// Unavailable: requests answered 503 while SetActionsDown held.
	Unavailable int
	// AcquiredTwice: job requests a listener asked for that its scale
	// set held already (a message about a job already acquired, asked
	// again). MaxCapacity: the last X-ScaleSetMaxCapacity received.
	AcquiredTwice, MaxCapacity int
}

func newActionsService() actionsService {
	return actionsService{key: []byte(randHex(16)), regTokens: map[string]string{}, admins: map[string]adminToken{},
		sets: map[int]*ScaleSet{}, sessions: map[string]*ssSession{}, bySet: map[int]*ssSession{}, nextSet: 0,
		nextReq: 700000, changed: make(chan struct{}), injected: map[int][]json.RawMessage{},
		adminTTL: time.Hour, sessionTTL: time.Hour, longPoll: 50 * time.Second, batch: 500}
}

// SetActionsTimes sets the admin and message queue tokens' lifetimes and
// the long poll's wait (zero leaves one as it is).
func (g *GitHub) SetActionsTimes(adminTTL, sessionTTL, longPoll time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	a := &g.actions
	if adminTTL > 0 {
		a.adminTTL = adminTTL
	}
	if sessionTTL > 0 {
		a.sessionTTL = sessionTTL
	}
	if longPoll > 0 {
		a.longPoll = longPoll
	}
}

// SetActionsDown makes every Actions service request answer 503 (the
// REST API stays up), or ends that.
func (g *GitHub) SetActionsDown(down bool) {
	g.mu.Lock()
	g.actions.down = down
	g.actionsChanged()
	g.mu.Unlock()
}

// ActionsStats reports what the Actions service saw.
func (g *GitHub) ActionsStats() ActionsStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.actions.stats
}

// ActionsSecrets lists every secret the Actions side handed out: the
// registration and admin tokens, the sessions' tokens, the JIT configs
// (tests look for them where they must not be).
func (g *GitHub) ActionsSecrets() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := append([]string(nil), g.actions.issued...)
	for tok := range g.actions.regTokens {
		out = append(out, tok)
	}
	for tok := range g.actions.admins {
		out = append(out, tok)
	}
	return out
}

// ScaleSets lists the scale sets.
func (g *GitHub) ScaleSets() []ScaleSet {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []ScaleSet
	for id := 1; id <= g.actions.nextSet; id++ {
		if s, ok := g.actions.sets[id]; ok {
			out = append(out, *s)
		}
	}
	return out
}

// DeleteScaleSet deletes a scale set as the service's dormant-set
// cleanup does (its session and runners go with it; its jobs not started
// go back to the queue).
func (g *GitHub) DeleteScaleSet(id int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dropScaleSet(id)
}

// Close ends the long polls in flight (httptest's Close waits for every
// request to end), then closes the server.
func (g *GitHub) Close() {
	g.mu.Lock()
	g.actions.closed = true
	g.actionsChanged()
	g.mu.Unlock()
	g.Server.Close()
}

// actionsChanged wakes the long polls. The caller holds g.mu.
func (g *GitHub) actionsChanged() {
	close(g.actions.changed)
	g.actions.changed = make(chan struct{})
}

// token makes a JWT (HS256 with the server's key) carrying exp.
func (a *actionsService) token(exp time.Time, subject string) string {
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"HS256","typ":"JWT"}`))
	claims, _ := json.Marshal(map[string]any{"exp": exp.Unix(), "sub": subject, "nonce": randHex(8)})
	body := head + "." + enc.EncodeToString(claims)
	m := hmac.New(sha256.New, a.key)
	m.Write([]byte(body))
	return body + "." + enc.EncodeToString(m.Sum(nil))
}

// registrationToken is POST <scope>/actions/runners/registration-token:
// a token the admin connection accepts for that scope.
func (g *GitHub) registrationToken(w http.ResponseWriter, scope string) {
	tok := "AABBCC" + strings.ToUpper(randHex(13))
	g.mu.Lock()
	g.actions.regTokens[tok] = scope
	g.mu.Unlock()
	writeJSON(w, 201, map[string]any{"token": tok, "expires_at": time.Now().Add(time.Hour).UTC().Format(time.RFC3339)})
}

// runnerRegistration is POST /actions/runner-registration: a
// registration token (Authorization: RemoteAuth) and the scope's GitHub
// URL exchanged for the Actions service's URL and an admin token.
func (g *GitHub) runnerRegistration(w http.ResponseWriter, r *http.Request) {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "RemoteAuth ")
	var body struct {
		URL   string `json:"url"`
		Event string `json:"runner_event"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Event != "register" {
		writeJSON(w, 400, map[string]string{"message": "url and runner_event are required"})
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	scope, known := g.actions.regTokens[tok]
	if !ok || !known {
		writeJSON(w, 401, map[string]string{"message": "Bad credentials"})
		return
	}
	u, err := url.Parse(body.URL)
	if err != nil || configScope(u.Path) != scope {
		writeJSON(w, 404, map[string]string{"message": "Not Found"})
		return
	}
	exp := time.Now().Add(g.actions.adminTTL)
	admin := g.actions.token(exp, scope)
	g.actions.admins[admin] = adminToken{scope: scope, exp: exp}
	writeJSON(w, 201, map[string]string{"url": g.URL + actionsPrefix + "/", "token": admin})
}

// configScope is the REST scope of a GitHub URL's path (/org or
// /owner/repo).
func configScope(path string) string {
	p := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(p) == 1 && p[0] != "":
		return "orgs/" + p[0]
	case len(p) == 2:
		return "repos/" + p[0] + "/" + p[1]
	}
	return ""
}

// actionsError answers the service's error shape.
func actionsError(w http.ResponseWriter, code int, typeName, msg string) {
	writeJSON(w, code, map[string]string{"typeName": typeName, "message": msg})
}

// actionsAPI serves the Actions service: api-version required, the admin
// token for everything but the message queue and acquirejobs (which take
// the session's token).
func (g *GitHub) actionsAPI(w http.ResponseWriter, r *http.Request) {
	g.mu.Lock()
	down := g.actions.down
	if down {
		g.actions.stats.Unavailable++
	}
	g.mu.Unlock()
	if down {
		http.Error(w, "Service Unavailable", http.StatusServiceUnavailable)
		return
	}
	if strings.HasPrefix(r.URL.Path, queuePrefix) {
		g.messageQueue(w, r)
		return
	}
	if r.URL.Query().Get("api-version") == "" {
		actionsError(w, 400, "VssVersionNotSpecifiedException", "The API version must be specified.")
		return
	}
	path := strings.Trim(strings.TrimPrefix(r.URL.Path, actionsPrefix), "/")
	parts := strings.Split(path, "/")
	if len(parts) == 5 && parts[2] == "runnerscalesets" && parts[4] == "acquirejobs" {
		g.acquireJobs(w, r, parts[3])
		return
	}
	g.mu.Lock()
	a, ok := g.actions.admins[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
	expired := ok && !time.Now().Before(a.exp)
	if expired {
		g.actions.stats.Expired401++
	}
	g.mu.Unlock()
	if !ok || expired {
		actionsError(w, 401, "VssUnauthorizedException", "The user is not authorized.")
		return
	}
	g.actionsRoute(w, r, a.scope, parts)
}

// actionsRoute dispatches an authenticated admin request.
func (g *GitHub) actionsRoute(w http.ResponseWriter, r *http.Request, scope string, p []string) {
	n := len(p)
	switch {
	case n == 3 && p[0] == "_apis" && p[1] == "runtime" && p[2] == "runnergroups" && r.Method == "GET":
		g.runnerGroups(w, r)
	case n == 3 && p[2] == "runnerscalesets" && r.Method == "GET":
		g.findScaleSet(w, r, scope)
	case n == 3 && p[2] == "runnerscalesets" && r.Method == "POST":
		g.createScaleSet(w, r, scope)
	case n == 4 && p[2] == "runnerscalesets":
		g.scaleSet(w, r, scope, p[3])
	case n == 5 && p[2] == "runnerscalesets" && p[4] == "sessions" && r.Method == "POST":
		g.openSession(w, r, scope, p[3])
	case n == 6 && p[2] == "runnerscalesets" && p[4] == "sessions":
		g.session(w, r, scope, p[3], p[5])
	case n == 5 && p[2] == "runnerscalesets" && p[4] == "generatejitconfig" && r.Method == "POST":
		g.scaleSetJIT(w, r, scope, p[3])
	case n == 5 && p[1] == "distributedtask" && p[4] == "agents" && r.Method == "GET":
		g.agentsByName(w, r, scope)
	case n == 6 && p[1] == "distributedtask" && p[4] == "agents":
		g.agent(w, r, scope, p[5])
	default:
		actionsError(w, 404, "NotFoundException", "no such route: "+r.Method+" "+strings.Join(p, "/"))
	}
}

// runnerGroups answers ?groupName= (only the Default group, id 1).
func (g *GitHub) runnerGroups(w http.ResponseWriter, r *http.Request) {
	out := []map[string]any{}
	if name := r.URL.Query().Get("groupName"); name == "" || strings.EqualFold(name, "default") {
		out = append(out, map[string]any{"id": 1, "name": "Default", "size": 0, "isDefaultGroup": true})
	}
	writeJSON(w, 200, map[string]any{"count": len(out), "value": out})
}

func (g *GitHub) setJSON(s *ScaleSet) map[string]any {
	labels := []map[string]string{}
	for _, l := range s.Labels {
		labels = append(labels, map[string]string{"type": "System", "name": l})
	}
	return map[string]any{"id": s.ID, "name": s.Name, "runnerGroupId": s.RunnerGroupID, "runnerGroupName": "Default",
		"labels": labels, "RunnerSetting": map[string]any{"disableUpdate": true}, "statistics": g.statistics(s.ID),
		"runnerJitConfigUrl": fmt.Sprintf("%s%s/_apis/runtime/runnerscalesets/%d/generatejitconfig", g.URL, actionsPrefix, s.ID)}
}

// findScaleSet is GET runnerscalesets?runnerGroupId=&name=.
func (g *GitHub) findScaleSet(w http.ResponseWriter, r *http.Request, scope string) {
	q := r.URL.Query()
	group, _ := strconv.Atoi(q.Get("runnerGroupId"))
	g.mu.Lock()
	out := []map[string]any{}
	for id := 1; id <= g.actions.nextSet; id++ {
		s, ok := g.actions.sets[id]
		if ok && s.Scope == scope && s.Name == q.Get("name") && (group == 0 || s.RunnerGroupID == group) {
			out = append(out, g.setJSON(s))
		}
	}
	g.mu.Unlock()
	writeJSON(w, 200, map[string]any{"count": len(out), "value": out})
}

// setBody reads a scale set's name, runner group and labels.
func setBody(r *http.Request) (name string, group int, labels []string, err error) {
	var body struct {
		Name          string `json:"name"`
		RunnerGroupID int    `json:"runnerGroupId"`
		Labels        []struct {
			Name string `json:"name"`
		} `json:"labels"`
	}
	if err = json.NewDecoder(r.Body).Decode(&body); err != nil {
		return "", 0, nil, err
	}
	for _, l := range body.Labels {
		labels = append(labels, l.Name)
	}
	return body.Name, body.RunnerGroupID, labels, nil
}

// createScaleSet is POST runnerscalesets.
func (g *GitHub) createScaleSet(w http.ResponseWriter, r *http.Request, scope string) {
	name, group, labels, err := setBody(r)
	if err != nil || name == "" || len(labels) == 0 {
		actionsError(w, 400, "ArgumentException", "a scale set needs a name and labels")
		return
	}
	if group == 0 {
		group = 1
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, s := range g.actions.sets {
		if s.Scope == scope && s.Name == name && s.RunnerGroupID == group {
			actionsError(w, 409, "RunnerScaleSetExistsException", "a scale set named "+name+" exists in this runner group")
			return
		}
	}
	g.actions.nextSet++
	s := &ScaleSet{ID: g.actions.nextSet, Name: name, RunnerGroupID: group, Labels: labels, Scope: scope}
	g.actions.sets[s.ID] = s
	writeJSON(w, 200, g.setJSON(s))
}

// scaleSet is GET, PATCH (labels, runner group) and DELETE of one scale set.
func (g *GitHub) scaleSet(w http.ResponseWriter, r *http.Request, scope, idText string) {
	id, _ := strconv.Atoi(idText)
	g.mu.Lock()
	defer g.mu.Unlock()
	s, ok := g.actions.sets[id]
	if !ok || s.Scope != scope {
		actionsError(w, 404, "RunnerScaleSetNotFoundException", "no scale set "+idText)
		return
	}
	switch r.Method {
	case "GET":
		writeJSON(w, 200, g.setJSON(s))
	case "PATCH":
		_, group, labels, err := setBody(r)
		if err != nil {
			actionsError(w, 400, "ArgumentException", err.Error())
			return
		}
		if len(labels) > 0 {
			s.Labels = labels
		}
		if group != 0 {
			s.RunnerGroupID = group
		}
		writeJSON(w, 200, g.setJSON(s))
	case "DELETE":
		for _, rn := range g.runners {
			if rn.ScaleSet == id && rn.Job != 0 {
				actionsError(w, 400, "JobStillRunningException", "a runner of the scale set runs a job")
				return
			}
		}
		g.dropScaleSet(id)
		w.WriteHeader(204)
	default:
		actionsError(w, 405, "MethodNotAllowed", r.Method)
	}
}

// dropScaleSet removes a scale set, its session and runners; its jobs
// not started are queued again. The caller holds g.mu.
func (g *GitHub) dropScaleSet(id int) {
	delete(g.actions.sets, id)
	if sess := g.actions.bySet[id]; sess != nil {
		delete(g.actions.sessions, sess.id)
		delete(g.actions.bySet, id)
	}
	for rid, rn := range g.runners {
		if rn.ScaleSet == id {
			delete(g.runners, rid)
		}
	}
	for _, j := range g.jobs {
		if j.ScaleSet == id && j.Status == "queued" {
			j.ScaleSet = 0
		}
	}
	g.actionsChanged()
}
