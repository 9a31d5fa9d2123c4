package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/gitea"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator"
	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// daemon is an orchestrator and what its HTTP interface is built with.
type daemon struct {
	o      *orchestrator.Orchestrator
	cfg    *config.Config
	redact *logging.Redactor
	now    func() time.Time
}

// hookSecret is testDaemon's webhook secret.
const hookSecret = "hook-s3cret-for-tests"

func testDaemon(t *testing.T, extra string) *daemon {
	t.Helper()
	return testDaemonAt(t, "http://127.0.0.1:1", extra)
}

// testDaemonAt is testDaemon with its forge at forgeURL.
func testDaemonAt(t *testing.T, forgeURL, extra string) *daemon {
	t.Helper()
	dir := t.TempDir()
	cfg, err := config.ParseConfig([]byte(fmt.Sprintf(`
state_dir: %s
cpi: {path: /nonexistent}
forges:
  - {name: gitea, type: gitea, url: %q, token_env: UNUSED, webhook_secret_env: UNUSED}
groups:
  - {name: g, scope: org, org: acme, labels: [linux], max_active_runners: 1, stemcell: {cid: sc-1}, runner: {command: /bin/true}}
%s`, dir, forgeURL, extra)))
	if err != nil {
		t.Fatal(err)
	}
	d := &daemon{cfg: cfg, redact: &logging.Redactor{}, now: time.Now}
	client := gitea.New(forgeURL, forge.NewTransport(nil))
	d.o, err = orchestrator.New(cfg, orchestrator.Options{Logger: logging.Discard(), Redactor: d.redact,
		Forges: map[string]orchestrator.Forge{"gitea": {Client: client, Secret: func() string { return hookSecret }}}, Now: func() time.Time { return d.now() }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.o.Close() })
	return d
}

func serve(t *testing.T, d *daemon) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveOn(t, d, ln)
}

// serveOn serves d's HTTP interface on ln until the test ends.
func serveOn(t *testing.T, d *daemon, ln net.Listener) string {
	t.Helper()
	h, err := Handler(d.o, d.cfg, logging.Fields{Logger: logging.Discard()}, d.redact, func() time.Time { return d.now() })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Serve(ctx, d.cfg.HTTP, ln, h, d.o.Metrics()); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return ln.Addr().String()
}

// dial connects to addr; the connection is closed when the test ends.
func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A client that sends its request one byte at a time is cut off at the
// read timeout, and no more than max_connections are served at once.
func TestHTTPTimeoutsAndConnectionCap(t *testing.T) {
	addr := serve(t, testDaemon(t, "http: {read_header_timeout: 300ms, read_timeout: 500ms}"))
	slow := dial(t, addr)
	start := time.Now()
	go func() {
		for _, b := range []byte("POST /webhooks/gitea HTTP/1.1\r\nHost: x\r\n") {
			if _, err := slow.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	slow.SetReadDeadline(time.Now().Add(5 * time.Second))
	// The server may close with our late bytes unread: the kernel then
	// answers with a reset, which is closing too. A timeout is not.
	if _, err := io.ReadAll(slow); err != nil && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("the slow connection was not closed by the server: %v", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("slow connection closed after %s", took)
	}

	// Two connections that began a request and stall take the two slots:
	// a third client waits until they have kept the server waiting for
	// the stall grace, and then gets the place of one of them.
	addr = serve(t, testDaemon(t, "http: {max_connections: 2, read_header_timeout: 30s}"))
	began := time.Now()
	for range 2 {
		dial(t, addr).Write([]byte("G"))
	}
	client := &http.Client{Timeout: 10 * time.Second}
	resp, err := client.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("a third client was not served while two stalled connections held the cap: %v", err)
	}
	resp.Body.Close()
	if took := time.Since(began); took < stallGrace {
		t.Errorf("a third connection was served %s after two others took the cap of 2, before they had stalled %s", took, stallGrace)
	}
}

// Keep-alive clients that sent their request and stay idle never keep a
// new client out: the cap closes the longest idle connection for it. And
// many clients reusing their connections all get answers.
func TestIdleConnectionsNeverKeepANewClientOut(t *testing.T) {
	addr := serve(t, testDaemon(t, "http: {max_connections: 8}"))
	var idlers []*http.Client
	for range 20 {
		c := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
		resp, err := c.Get("http://" + addr + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close() // the connection stays open, idle
		idlers = append(idlers, c)
	}
	fresh := &http.Client{Transport: &http.Transport{}, Timeout: 2 * time.Second}
	start := time.Now()
	resp, err := fresh.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("/healthz with 20 idle keep-alive connections open (cap 8): %v", err)
	}
	resp.Body.Close()
	// At most the cap's idle grace (1 s: a connection idle that long is
	// closed for a newcomer), and a margin.
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("/healthz took %s", took)
	}
	// 200 clients × 10 requests each on their own kept-alive connection,
	// at once, through a cap of 8: every request answered.
	burst(t, 200, 10, func() *http.Client {
		return &http.Client{Transport: &http.Transport{}, Timeout: 10 * time.Second}
	}, func(c *http.Client) (*http.Response, error) { return c.Get("http://" + addr + "/healthz") })
	for _, c := range idlers {
		c.CloseIdleConnections()
	}
}

// A burst of webhook deliveries through one keep-alive client (as a
// forge's sender keeps its connections) past the cap: a POST is never
// retried by the client, so a connection closed under a request loses
// the delivery. Near the cap, answers tell clients to close instead.
func TestPOSTBurstThroughTheCapLosesNothing(t *testing.T) {
	addr := serve(t, testDaemon(t, "http: {max_connections: 8}"))
	sender := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 10 * time.Second}
	burst(t, 64, 20, func() *http.Client { return sender }, func(c *http.Client) (*http.Response, error) {
		return c.Post("http://"+addr+"/webhooks/gitea", "application/json", strings.NewReader(`{"action":"queued"}`))
	})
}

// burst runs n goroutines, each sending each requests on its own client's
// connections, and fails t for every request that got no answer.
func burst(t *testing.T, n, each int, client func() *http.Client, send func(*http.Client) (*http.Response, error)) {
	t.Helper()
	var wg sync.WaitGroup
	var failed atomic.Int64
	var firstErr atomic.Value
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := client()
			for range each {
				resp, err := send(c)
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	if f := failed.Load(); f > 0 {
		t.Errorf("%d of %d requests got no answer, first: %v", f, n*each, firstErr.Load())
	}
}

// Without admin_token_file, drain and resume work on a loopback listener
// only.
func TestDrainNeedsATokenOffLoopback(t *testing.T) {
	for listen, want := range map[string]int{"127.0.0.1:8480": http.StatusOK, "0.0.0.0:8480": http.StatusForbidden, "[::]:8480": http.StatusForbidden} {
		o := testDaemon(t, "listen: \""+listen+"\"")
		addr := serve(t, o)
		resp, err := http.Post("http://"+addr+"/api/v1/groups/g/drain", "", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("listen %s: drain answered %d, want %d", listen, resp.StatusCode, want)
		}
	}
}
