package forgetest

import (
	"bytes"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// actionsClient speaks the Actions service's protocol as raw requests
// (the server's own tests: no Runway client in the way).
type actionsClient struct {
	t       *testing.T
	g       *GitHub
	service string // the Actions service URL
	admin   string // the admin token
}

func (c *actionsClient) do(method, u string, hdr map[string]string, in any) (int, []byte) {
	c.t.Helper()
	var body io.Reader = http.NoBody
	if in != nil {
		b, _ := json.Marshal(in)
		body = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, u, body)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// connect makes the admin connection for scope (org acme unless given).
func connect(t *testing.T, g *GitHub, configPath, restScope string) *actionsClient {
	t.Helper()
	c := &actionsClient{t: t, g: g}
	code, b := c.do("POST", g.URL+"/"+restScope+"/actions/runners/registration-token", map[string]string{"Authorization": "Bearer " + g.APIToken}, nil)
	var reg struct{ Token string }
	if json.Unmarshal(b, &reg); code != 201 || reg.Token == "" {
		t.Fatalf("registration token: %d %s", code, b)
	}
	code, b = c.do("POST", g.URL+"/actions/runner-registration", map[string]string{"Authorization": "RemoteAuth " + reg.Token},
		map[string]string{"url": "https://github.com" + configPath, "runner_event": "register"})
	var conn struct{ URL, Token string }
	if json.Unmarshal(b, &conn); code != 200 || conn.URL == "" || conn.Token == "" {
		t.Fatalf("the admin connection: %d %s; want 200 with a url and token (as the service answers)", code, b)
	}
	c.service, c.admin = strings.TrimRight(conn.URL, "/"), conn.Token
	return c
}

func (c *actionsClient) api(method, path string, in any) (int, []byte) {
	c.t.Helper()
	sep := "?"
	if strings.Contains(path, "?") {
		sep = "&"
	}
	return c.do(method, c.service+"/"+path+sep+"api-version=6.0-preview", map[string]string{"Authorization": "Bearer " + c.admin}, in)
}

func (c *actionsClient) makeSet(name string, labels ...string) (int, []string) {
	c.t.Helper()
	var ls []map[string]string
	for _, l := range labels {
		ls = append(ls, map[string]string{"type": "System", "name": l})
	}
	code, b := c.api("POST", "_apis/runtime/runnerscalesets", map[string]any{"name": name, "runnerGroupId": 1, "labels": ls})
	var set struct {
		ID     int
		Labels []struct{ Name string }
	}
	if json.Unmarshal(b, &set); code != 200 || set.ID == 0 {
		c.t.Fatalf("making scale set %s: %d %s", name, code, b)
	}
	var names []string
	for _, l := range set.Labels {
		names = append(names, l.Name)
	}
	return set.ID, names
}

type testSession struct {
	ID    string `json:"sessionId"`
	Queue string `json:"messageQueueUrl"`
	Token string `json:"messageQueueAccessToken"`
}

func (c *actionsClient) open(set int) (testSession, int, string) {
	c.t.Helper()
	code, b := c.api("POST", fmt.Sprintf("_apis/runtime/runnerscalesets/%d/sessions", set), map[string]string{"ownerName": "test"})
	var s testSession
	json.Unmarshal(b, &s)
	return s, code, string(b)
}

type testEntry struct {
	Kind      string `json:"messageType"`
	RequestID int64  `json:"runnerRequestId"`
	JobID     string `json:"jobId"`
	Result    string `json:"result"`
}

// poll is one long poll: its status, message id and entries.
func (c *actionsClient) poll(s testSession, last int64, capacity int) (int, int64, []testEntry, int) {
	c.t.Helper()
	u := s.Queue
	if last > 0 {
		u += "?lastMessageId=" + strconv.FormatInt(last, 10)
	}
	code, b := c.do("GET", u, map[string]string{"Authorization": "Bearer " + s.Token, "X-ScaleSetMaxCapacity": strconv.Itoa(capacity)}, nil)
	if code != 200 || len(b) == 0 {
		return code, 0, nil, len(b)
	}
	var m struct {
		ID   int64 `json:"messageId"`
		Body string
	}
	var entries []testEntry
	if err := json.Unmarshal(b, &m); err != nil || json.Unmarshal([]byte(m.Body), &entries) != nil {
		c.t.Fatalf("message %s", b)
	}
	return code, m.ID, entries, len(b)
}

func (c *actionsClient) deleteMessage(s testSession, id int64) {
	c.t.Helper()
	if code, b := c.do("DELETE", s.Queue+"/"+strconv.FormatInt(id, 10), map[string]string{"Authorization": "Bearer " + s.Token}, nil); code != 204 {
		c.t.Fatalf("deleting message %d: %d %s", id, code, b)
	}
}

func newActionsServer(t *testing.T, flow ActionsFlow) *GitHub {
	g := NewGitHub(testToken)
	t.Cleanup(g.Close)
	g.SetActionsFlow(flow)
	g.SetActionsTimes(0, 0, 300*time.Millisecond)
	return g
}

// github.com: no JobAvailable; jobs assigned at the poll as far as the
// poll's capacity leaves room (read at each poll), runnerRequestId 0 and
// the job's identity a UUID in jobId; acquirejobs 404.
func TestGitHubComAssignsDirectly(t *testing.T) {
	g := newActionsServer(t, FlowGitHubCom)
	c := connect(t, g, "/acme", "orgs/acme")
	set, _ := c.makeSet("s", "linux")
	s, code, body := c.open(set)
	if code != 200 {
		t.Fatalf("session: %d %s", code, body)
	}
	var jobs []int64
	for range 3 {
		jobs = append(jobs, g.AddJob("acme/app", []string{"linux"}))
	}
	_, id, entries, _ := c.poll(s, 0, 2)
	if len(entries) != 2 {
		t.Fatalf("entries %+v; want two JobAssigned (capacity 2)", entries)
	}
	for i, e := range entries {
		if e.Kind != "JobAssigned" || e.RequestID != 0 || e.JobID != g.Job(jobs[i]).UUID || len(e.JobID) != 36 {
			t.Errorf("entry %+v; want JobAssigned, runnerRequestId 0, the job's UUID", e)
		}
	}
	if code, _ := c.do("POST", c.service+fmt.Sprintf("/_apis/runtime/runnerscalesets/%d/acquirejobs?api-version=6.0-preview", set),
		map[string]string{"Authorization": "Bearer " + s.Token}, []int64{g.Job(jobs[0]).RequestID}); code != 404 {
		t.Errorf("acquirejobs answered %d; want 404 (github.com has no acquire step)", code)
	}
	c.deleteMessage(s, id)
	if code, _, entries, _ := c.poll(s, id, 2); code == 200 && len(entries) > 0 {
		t.Fatalf("at capacity: %+v; want nothing more assigned", entries)
	}
	_, _, entries, _ = c.poll(s, id, 3)
	if len(entries) != 1 || entries[0].JobID != g.Job(jobs[2]).UUID || g.Job(jobs[2]).ScaleSet != set {
		t.Fatalf("capacity raised to 3: %+v; want the third job assigned", entries)
	}
	if st := g.ActionsStats(); st.Assigned != 3 || st.AcquireNotFound != 1 || st.MaxCapacity != 3 {
		t.Errorf("stats %+v", st)
	}
}

// github.com answers some idle polls 200 with no body (ARC #4285,
// #4470); GHES answers 202.
func TestIdlePollsAnswered(t *testing.T) {
	for flow, want := range map[ActionsFlow]string{FlowGitHubCom: "202,200:0", FlowGHES: "202,202"} {
		g := newActionsServer(t, flow)
		c := connect(t, g, "/acme", "orgs/acme")
		set, _ := c.makeSet("s", "linux")
		s, _, _ := c.open(set)
		var got []string
		for range 2 {
			code, _, _, n := c.poll(s, 0, 1)
			if code == 200 {
				got = append(got, fmt.Sprintf("200:%d", n))
			} else {
				got = append(got, strconv.Itoa(code))
			}
		}
		if strings.Join(got, ",") != want {
			t.Errorf("%s: idle polls %v; want %s", flow, got, want)
		}
	}
}

// GHES up to 3.19: JobAvailable (with the request id), acquired, then
// JobAssigned.
func TestGHESOffersThenAcquires(t *testing.T) {
	g := newActionsServer(t, FlowGHES)
	c := connect(t, g, "/acme", "orgs/acme")
	set, _ := c.makeSet("s", "linux")
	s, _, _ := c.open(set)
	job := g.AddJob("acme/app", []string{"linux"})
	_, id, entries, _ := c.poll(s, 0, 5)
	if len(entries) != 1 || entries[0].Kind != "JobAvailable" || entries[0].RequestID != g.Job(job).RequestID || entries[0].JobID != g.Job(job).UUID {
		t.Fatalf("entries %+v; want one JobAvailable with the request id and jobId", entries)
	}
	code, b := c.do("POST", c.service+fmt.Sprintf("/_apis/runtime/runnerscalesets/%d/acquirejobs?api-version=6.0-preview", set),
		map[string]string{"Authorization": "Bearer " + s.Token}, []int64{entries[0].RequestID})
	if code != 200 || !strings.Contains(string(b), strconv.FormatInt(g.Job(job).RequestID, 10)) {
		t.Fatalf("acquire: %d %s", code, b)
	}
	c.deleteMessage(s, id)
	_, _, entries, _ = c.poll(s, id, 5)
	if len(entries) != 1 || entries[0].Kind != "JobAssigned" {
		t.Fatalf("after acquiring: %+v; want JobAssigned", entries)
	}
}

// An expired session still holds its scale set (409); its token is
// refused, its refresh is 404, its delete 400
// RunnerScaleSetSessionExpiredException — after which a session opens.
func TestExpiredSession(t *testing.T) {
	g := newActionsServer(t, FlowGitHubCom)
	c := connect(t, g, "/acme", "orgs/acme")
	set, _ := c.makeSet("s", "linux")
	s, _, _ := c.open(set)
	g.ExpireSessions()
	if _, code, body := c.open(set); code != 409 || !strings.Contains(body, "RunnerScaleSetSessionConflictException") {
		t.Errorf("open beside the expired session: %d %s; want 409 RunnerScaleSetSessionConflictException", code, body)
	}
	if code, _, _, _ := c.poll(s, 0, 1); code != 401 {
		t.Errorf("poll: %d; want 401", code)
	}
	path := fmt.Sprintf("_apis/runtime/runnerscalesets/%d/sessions/%s", set, s.ID)
	if code, b := c.api("PATCH", path, nil); code != 404 {
		t.Errorf("refresh: %d %s; want 404", code, b)
	}
	if code, b := c.api("DELETE", path, nil); code != 400 || !strings.Contains(string(b), "RunnerScaleSetSessionExpiredException") {
		t.Errorf("delete: %d %s; want 400 RunnerScaleSetSessionExpiredException", code, b)
	}
	if _, code, body := c.open(set); code != 200 {
		t.Errorf("open after the delete: %d %s", code, body)
	}
}

// A scale set's message stream is its own: what one session left
// undeleted is the next session's first message.
func TestMessageStreamReplayedToANewSession(t *testing.T) {
	for _, flow := range []ActionsFlow{FlowGitHubCom, FlowGHES} {
		g := newActionsServer(t, flow)
		c := connect(t, g, "/acme", "orgs/acme")
		set, _ := c.makeSet("s", "linux")
		first, _, _ := c.open(set)
		g.AddJob("acme/app", []string{"linux"})
		_, id, entries, _ := c.poll(first, 0, 5)
		if code, _ := c.api("DELETE", fmt.Sprintf("_apis/runtime/runnerscalesets/%d/sessions/%s", set, first.ID), nil); code != 204 {
			t.Fatalf("%s: deleting the session: %d", flow, code)
		}
		next, _, _ := c.open(set)
		_, again, replayed, _ := c.poll(next, 0, 5)
		if again != id || len(replayed) != len(entries) || replayed[0] != entries[0] {
			t.Errorf("%s: the new session's first message %d %+v; want message %d %+v again", flow, again, replayed, id, entries)
		}
	}
}

// The scale set's name is always among its labels; without custom
// labels (GHES before 3.18) it is the only one.
func TestScaleSetNameIsALabel(t *testing.T) {
	g := newActionsServer(t, FlowGHES)
	c := connect(t, g, "/acme", "orgs/acme")
	if _, labels := c.makeSet("runway", "linux"); strings.Join(labels, ",") != "runway,linux" {
		t.Errorf("labels %v; want runway,linux", labels)
	}
	g.SetCustomLabels(false)
	if _, labels := c.makeSet("other", "linux", "x64"); strings.Join(labels, ",") != "other" {
		t.Errorf("without custom labels: %v; want the name only", labels)
	}
}

// An assignment no runner of the set takes in time is taken back
// (JobCompleted, canceled) and made again, the job's jobId kept.
func TestAssignmentTakenBack(t *testing.T) {
	g := newActionsServer(t, FlowGitHubCom)
	g.SetAssignTimeout(100 * time.Millisecond)
	c := connect(t, g, "/acme", "orgs/acme")
	set, _ := c.makeSet("s", "linux")
	s, _, _ := c.open(set)
	job := g.AddJob("acme/app", []string{"linux"})
	_, id, entries, _ := c.poll(s, 0, 5)
	c.deleteMessage(s, id)
	_, _, again, _ := c.poll(s, id, 5)
	uuid := g.Job(job).UUID
	if len(entries) != 1 || len(again) != 2 || again[0].Kind != "JobCompleted" || again[0].Result != "canceled" ||
		again[1].Kind != "JobAssigned" || again[0].JobID != uuid || again[1].JobID != uuid {
		t.Fatalf("first %+v, then %+v; want the assignment canceled and made again, one jobId", entries, again)
	}
}

// An App's JWT, signed with its key, is exchanged for an installation
// token that the REST API takes until it expires (never on an
// enterprise's endpoints); a JWT signed with another key is refused.
func TestAppInstallationTokens(t *testing.T) {
	g := newActionsServer(t, FlowGitHubCom)
	key, _ := rsa.GenerateKey(rand.Reader, 2048)
	other, _ := rsa.GenerateKey(rand.Reader, 2048)
	g.AddApp("123", &key.PublicKey, 42)
	c := &actionsClient{t: t, g: g}
	mint := func(k *rsa.PrivateKey, iss string, life time.Duration) (int, string) {
		now := time.Now().Add(-30 * time.Second)
		code, b := c.do("POST", g.URL+"/app/installations/42/access_tokens", map[string]string{"Authorization": "Bearer " + appJWT(k, iss, now, now.Add(life))}, nil)
		var tok struct{ Token string }
		json.Unmarshal(b, &tok)
		return code, tok.Token
	}
	code, tok := mint(key, "123", 9*time.Minute)
	if code != 201 || !strings.HasPrefix(tok, "ghs_") {
		t.Fatalf("mint: %d %q", code, tok)
	}
	runners := func(path string) int {
		code, _ := c.do("GET", g.URL+path, map[string]string{"Authorization": "Bearer " + tok}, nil)
		return code
	}
	if got := runners("/orgs/acme/actions/runners"); got != 200 {
		t.Errorf("the REST API with the installation token: %d", got)
	}
	if got := runners("/enterprises/acme-corp/actions/runners"); got != 403 {
		t.Errorf("an enterprise's endpoint with an installation token: %d; want 403", got)
	}
	for what, k := range map[string]*rsa.PrivateKey{"another key": other} {
		if code, _ := mint(k, "123", 9*time.Minute); code != 401 {
			t.Errorf("%s: %d; want 401", what, code)
		}
	}
	if code, _ := mint(key, "123", 20*time.Minute); code != 401 {
		t.Errorf("exp 20 minutes after iat: %d; want 401", code)
	}
	if code, _ := mint(key, "999", 9*time.Minute); code != 401 {
		t.Errorf("an unknown App: %d; want 401", code)
	}
	g.SetInstallationTokenTTL(-time.Second) // minted expired
	if _, tok = mint(key, "123", 9*time.Minute); runners("/orgs/acme/actions/runners") != 401 {
		t.Errorf("an expired installation token: want 401")
	}
	if st := g.AppStats(); st.Minted != 2 || st.Refused != 3 || st.ExpiredUses != 1 {
		t.Errorf("stats %+v", st)
	}
}

// appJWT signs an App's JWT as GitHub's documentation describes it.
func appJWT(key *rsa.PrivateKey, iss string, iat, exp time.Time) string {
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT"}`))
	claims, _ := json.Marshal(map[string]any{"iss": iss, "iat": iat.Unix(), "exp": exp.Unix()})
	body := head + "." + enc.EncodeToString(claims)
	sum := sha256.Sum256([]byte(body))
	sig, _ := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	return body + "." + enc.EncodeToString(sig)
}
