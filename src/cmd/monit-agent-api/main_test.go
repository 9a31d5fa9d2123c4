package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// What reaches monit's socket for each request the front passes on (the
// front against real monit: src/integration, "the dev stemcell").
func TestWhatMonitReceives(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "monit.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	type got struct{ method, path, auth, cookie, body string }
	seen := make(chan got, 1)
	backend := &httptest.Server{Listener: ln, Config: &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		c, _ := r.Cookie("securitytoken")
		v := ""
		if c != nil {
			v = c.Value
		}
		if r.Header.Get("User-Agent") == "Go-http-client/1.1" && r.URL.Path == "/_status2" && r.Header.Get("X-Test") == "" {
			// the front's own look before a stop: the service monitored
			_, _ = io.WriteString(w, `<monit><services><service name="probe"><monitor>1</monitor></service></services></monit>`)
			return
		}
		seen <- got{r.Method, r.URL.RequestURI(), r.Header.Get("Authorization"), v, string(b)}
	})}}
	backend.Start()
	defer backend.Close()
	front := httptest.NewServer(Handler(sock))
	defer front.Close()

	send := func(method, path, body string) got {
		req, _ := http.NewRequest(method, front.URL+path, strings.NewReader(body))
		req.SetBasicAuth("vcap", "pw")
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("X-Test", "1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return <-seen
	}
	g := send("POST", "/probe", "action=start")
	token := strings.TrimPrefix(g.body, "action=start&securitytoken=")
	if len(token) != 32 || g.cookie != token || g.auth == "" {
		t.Errorf("POST without a token: monit got %+v; want the agent's body with a token, the same token as cookie, the credentials", g)
	}
	if g := send("POST", "/probe", "action=stop&securitytoken=abc"); g.body != "action=stop&securitytoken=abc" || g.cookie != "" {
		t.Errorf("POST with a token: monit got %+v; want it as sent", g)
	}
	if g := send("GET", "/_status2?format=xml", ""); g.path != "/_status2?format=xml" || g.body != "" || g.cookie != "" {
		t.Errorf("GET: monit got %+v; want it as sent", g)
	}
	big := "action=start&x=" + strings.Repeat("a", maxForm)
	if g := send("POST", "/probe", big); g.body != big {
		t.Errorf("an oversized form: monit got %d bytes, want the %d sent", len(g.body), len(big))
	}
}

// While monit is down the front answers 503, which bosh-agent retries.
func TestMonitDown(t *testing.T) {
	front := httptest.NewServer(Handler(filepath.Join(t.TempDir(), "none.sock")))
	defer front.Close()
	resp, err := http.Get(front.URL + "/_status2?format=xml")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("monit down: %s, want 503", resp.Status)
	}
}

// fakeMonit answers as monit 5.33 does where it matters here: a stop of a
// service it does not monitor is ignored; a monitor makes it monitored.
type fakeMonit struct {
	mu      sync.Mutex
	monitor int
	stopped bool
	actions []string
}

func (f *fakeMonit) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Method == http.MethodGet {
		fmt.Fprintf(w, `<?xml version="1.0" encoding="ISO-8859-1"?><monit><services><service name="probe"><monitor>%d</monitor><pendingaction>0</pendingaction></service></services></monit>`, f.monitor)
		return
	}
	_ = r.ParseForm()
	if r.PostForm.Get("securitytoken") == "" {
		http.Error(w, "Invalid CSRF Token", http.StatusForbidden)
		return
	}
	a := r.PostForm.Get("action")
	f.actions = append(f.actions, a)
	switch a {
	case "monitor":
		f.monitor = 1
	case "unmonitor":
		f.monitor = 0
	case "stop":
		if f.monitor != 0 {
			f.stopped, f.monitor = true, 0
		}
	}
}

// The agent's drain then stop: the stop reaches a monitored service, and
// stops it, unmonitored after as monit 5.2 leaves it.
func TestStopAfterUnmonitorStops(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "monit.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeMonit{monitor: 1}
	backend := &httptest.Server{Listener: ln, Config: &http.Server{Handler: fake}}
	backend.Start()
	defer backend.Close()
	front := httptest.NewServer(Handler(sock))
	defer front.Close()
	for _, action := range []string{"unmonitor", "stop"} {
		req, _ := http.NewRequest("POST", front.URL+"/probe", strings.NewReader("action="+action))
		req.SetBasicAuth("vcap", "pw")
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s", action, resp.Status)
		}
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if !fake.stopped || fake.monitor != 0 || strings.Join(fake.actions, ",") != "unmonitor,monitor,stop" {
		t.Errorf("stopped %v, monitor %d, actions %v; want stopped, unmonitored, after unmonitor,monitor,stop", fake.stopped, fake.monitor, fake.actions)
	}
}
