package forgetest

// What both contract servers share: the server, its webhook deliveries
// and JSON answers.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"time"
)

// server is what both contract servers are: an HTTP server on 127.0.0.1
// counting its requests and sending webhook deliveries, holding its
// jobs (J: the forge's job record). mu guards the forge's own state too.
type server[J any] struct {
	*httptest.Server
	mu         sync.Mutex
	jobs       map[int64]*J
	hooks      []hook
	requests   map[string]int // "METHOD /path" → requests
	deliveries *deliveries
}

// start serves h, its webhooks sent by d.
func (s *server[J]) start(h http.HandlerFunc, d *deliveries) {
	s.jobs, s.requests, s.deliveries = map[int64]*J{}, map[string]int{}, d
	s.Server = httptest.NewServer(h)
}

// AddHook registers a workflow_job webhook (a system hook: every
// repository's jobs).
func (s *server[J]) AddHook(u string, secret []byte) {
	s.mu.Lock()
	s.hooks = append(s.hooks, hook{u, secret})
	s.mu.Unlock()
}

// Requests counts API requests by "METHOD /path" (query dropped).
func (s *server[J]) Requests() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.requests)
}

// Job returns a copy of a job.
func (s *server[J]) Job(id int64) J {
	s.mu.Lock()
	defer s.mu.Unlock()
	return *s.jobs[id]
}

// serveJob answers job id as render writes it (under mu), or 404 with
// notFound where there is no such job or in says it is not the scope's.
func (s *server[J]) serveJob(w http.ResponseWriter, id int64, in func(*J) bool, render func(*J) map[string]any, notFound string) {
	s.mu.Lock()
	j, ok := s.jobs[id]
	var body map[string]any
	if ok && in(j) {
		body = render(j)
	}
	s.mu.Unlock()
	if body == nil {
		writeJSON(w, 404, map[string]string{"message": notFound})
		return
	}
	writeJSON(w, 200, body)
}

// WaitDeliveries waits for webhook deliveries in flight.
func (s *server[J]) WaitDeliveries() { s.deliveries.Wait() }

// FailedDeliveries lists the webhook deliveries that failed.
func (s *server[J]) FailedDeliveries() []string { return s.deliveries.Failed() }

// hook is a webhook: where deliveries go and the secret signing them.
type hook struct {
	url    string
	secret []byte
}

// deliveries sends one forge's webhook deliveries in the background and
// keeps the failures: one attempt each, as Gitea and GitHub make (neither
// retries a failed delivery by itself).
type deliveries struct {
	wg     sync.WaitGroup
	client *http.Client
	slots  chan struct{} // deliveries in flight at once; nil: no bound
	mu     sync.Mutex
	failed []string
}

// giteaDeliveries is Gitea 1.26's webhook sender: a queue with at most
// half the CPUs as workers (1 to 10, modules/setting/queue.go) on one
// keep-alive HTTP client timing out after 5 s (services/webhook).
func giteaDeliveries() *deliveries {
	return &deliveries{client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{}},
		slots: make(chan struct{}, min(max(runtime.NumCPU()/2, 1), 10))}
}

// gitHubDeliveries is GitHub's as far as it is documented: an answer is
// awaited 10 s. How many deliveries GitHub sends at once, and over which
// connections, is not: every delivery goes at once over one keep-alive
// client, the harshest case for the receiver.
func gitHubDeliveries() *deliveries {
	return &deliveries{client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{}}}
}

// send posts one delivery to h in the background.
func (d *deliveries) send(h hook, body []byte, headers map[string]string) {
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		if d.slots != nil {
			d.slots <- struct{}{}
			defer func() { <-d.slots }()
		}
		req, _ := http.NewRequest("POST", h.url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := d.client.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode/100 != 2 {
				err = fmt.Errorf("HTTP %d", resp.StatusCode)
			}
		}
		if err != nil {
			d.mu.Lock()
			d.failed = append(d.failed, headers["X-GitHub-Event"]+headers["X-Gitea-Event"]+": "+err.Error())
			d.mu.Unlock()
		}
	}()
}

// Wait waits for the deliveries in flight.
func (d *deliveries) Wait() { d.wg.Wait() }

// Failed lists the deliveries that failed (an error or a non-2xx answer).
func (d *deliveries) Failed() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.failed...)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randUUID() string {
	h := randHex(16)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

// allCompleted tells whether every job of ids has status completed.
func allCompleted(ids []int64, status func(id int64) string) bool {
	for _, id := range ids {
		if status(id) != "completed" {
			return false
		}
	}
	return true
}
