package forgetest

// What both contract servers share: webhook deliveries and JSON answers.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"sync"
	"time"
)

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
