package forgetest

// The GitHub contract server's Actions service: runner scale sets as
// actions-runner-controller's listener and actions/scaleset use them, and
// as their users have seen the service answer since mid-2025 (read for
// facts; differences in docs/testing.md). Its state lives under g.mu
// beside the REST API's jobs and runners: a scale set's runners are
// GitHub runners (listed by the REST API), its jobs GitHub jobs.
//
// Two flows (SetActionsFlow): github.com's, where the service assigns a
// job to a scale set itself (JobAssigned, jobId a UUID, runnerRequestId 0,
// capped by the capacity each poll tells) and acquirejobs answers 404;
// and GHES up to 3.19's, where it offers JobAvailable and the listener
// acquires.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// actionsPrefix is where the Actions service is served (the admin
// connection answers g.URL + actionsPrefix as its URL).
const actionsPrefix = "/_services/pipelines"

// queuePrefix is where message queues are served.
const queuePrefix = "/_services/broker/sessions/"

const (
	// FlowGitHubCom is github.com's since mid-2025 (garm's "Handle new
	// jobID for scale sets", actions/scaleset #4): no JobAvailable, a
	// JobAssigned at the poll for as many jobs as the poll's
	// X-ScaleSetMaxCapacity leaves room for (capacity 0 read as no bound:
	// SetZeroCapacityAssigns), runnerRequestId 0 and the job's identity
	// in jobId (a UUID); POST acquirejobs answers 404; an idle poll is
	// answered 202 or, every other time, 200 with an empty body (ARC
	// #4285, #4470).
	FlowGitHubCom ActionsFlow = iota
	// FlowGHES is GitHub Enterprise Server up to 3.19 (actions/scaleset
	// #75, #90): JobAvailable with the runner request id, acquired by
	// POST acquirejobs, then JobAssigned.
	FlowGHES
)

func (f ActionsFlow) String() string {
	if f == FlowGHES {
		return "ghes"
	}
	return "github.com"
}

// ScaleSet is a runner scale set as the server holds it.
type ScaleSet struct {
	ID            int
	Name          string
	RunnerGroupID int
	// Labels are the set's labels as the service keeps them: its name
	// first, then the labels it was given unless custom labels are off
	// (GHES before 3.18, or the feature flag off: the name only).
	Labels []string
	Scope  string // orgs/x, repos/o/r or enterprises/e
}

// actionsService is the Actions service's state (under GitHub.mu).
type actionsService struct {
	key       []byte
	regTokens map[string]string         // registration token → scope
	admins    map[string]adminToken     // admin token → its scope and expiry
	sets      map[int]*ScaleSet         // by id
	queues    map[int]*ssQueue          // each scale set's message stream
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

	flow ActionsFlow
	// noCustomLabels: a scale set keeps its name as its only label.
	noCustomLabels bool
	// zeroCapAssigns: on github.com, a poll telling capacity 0 is
	// assigned jobs as if it told none (what the service does then is
	// not known; this is the harsher reading).
	zeroCapAssigns bool
	// assignTimeout: a job assigned to a scale set and taken by none of
	// its runners within it is taken back (JobCompleted, canceled) and
	// assigned again, up to 3 times (actions/scaleset README); 0: never.
	assignTimeout time.Duration
	idlePolls     int // idle polls answered (every other one 200 empty on github.com)
	// failAcquire: acquirejobs answers this status (0: as the flow
	// does); refuseAdmin: the next admin connections answered 401 (a
	// registration token the service does not know yet).
	failAcquire, refuseAdmin int
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
	// AcquireNotFound: acquirejobs answered 404 (github.com has no
	// acquire step). Assigned: JobAssigned sent; Reassigned: assignments
	// taken back (JobCompleted canceled). EmptyPolls: idle polls answered
	// 200 with no body.
	AcquireNotFound, Assigned, Reassigned, EmptyPolls int
	// SessionDeletes: DELETE of a session (ExpiredDeletes of them
	// answered 400 RunnerScaleSetSessionExpiredException). LabelPatches:
	// PATCHes of a scale set.
	SessionDeletes, ExpiredDeletes, LabelPatches int
}

func newActionsService() actionsService {
	return actionsService{key: []byte(randHex(16)), regTokens: map[string]string{}, admins: map[string]adminToken{},
		sets: map[int]*ScaleSet{}, queues: map[int]*ssQueue{}, sessions: map[string]*ssSession{}, bySet: map[int]*ssSession{},
		nextReq: 700000, changed: make(chan struct{}), injected: map[int][]json.RawMessage{},
		adminTTL: time.Hour, sessionTTL: time.Hour, longPoll: 50 * time.Second, batch: 50, zeroCapAssigns: true}
}

// ActionsFlow is the flow the service speaks.
func (g *GitHub) ActionsFlow() ActionsFlow {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.actions.flow
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
	if known && g.actions.refuseAdmin > 0 {
		g.actions.refuseAdmin--
		known = false
	}
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
	// 200, as the service answers it (scaleset accepts any 2xx).
	writeJSON(w, 200, map[string]string{"url": g.URL + actionsPrefix + "/", "token": admin})
}

// configScope is the REST scope of a GitHub URL's path (/org,
// /owner/repo or /enterprises/name).
func configScope(path string) string {
	p := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(p) == 2 && strings.EqualFold(p[0], "enterprises"):
		return "enterprises/" + p[1]
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
