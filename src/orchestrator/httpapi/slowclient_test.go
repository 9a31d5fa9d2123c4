package httpapi

// Clients that trickle their requests (slowloris, slow bodies) against
// the connection cap, from the attacker's side: real deliveries must
// still be answered at once, and the trickling connections cut off.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
)

// heldConns is the server's listener as the test sees it: which
// connections it accepted and has not closed, by source address.
type heldConns struct {
	net.Listener
	mu   sync.Mutex
	open map[string]int
}

func (l *heldConns) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	ip := c.RemoteAddr().(*net.TCPAddr).IP.String()
	l.mu.Lock()
	l.open[ip]++
	l.mu.Unlock()
	return &heldConn{Conn: c, l: l, ip: ip}, nil
}

// from counts the open connections of these source addresses.
func (l *heldConns) from(ips ...string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ip := range ips {
		n += l.open[ip]
	}
	return n
}

type heldConn struct {
	net.Conn
	l    *heldConns
	ip   string
	once sync.Once
}

func (c *heldConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		c.l.open[c.ip]--
		c.l.mu.Unlock()
	})
	return c.Conn.Close()
}

// serveHeld is serve with the listener the test watches.
func serveHeld(t *testing.T, d *daemon) (string, *heldConns) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := &heldConns{Listener: ln, open: map[string]int{}}
	return serveOn(t, d, held), held
}

// attacker is one source address holding connections that each send a
// webhook POST's headers and then trickle its body, a byte every 100 ms,
// never finishing it (or, with headers, trickle the headers themselves).
// With again, a connection the server cuts off is replaced at once, so
// the attack keeps the cap full.
type attacker struct {
	from    net.IP
	again   bool
	headers bool
	mu      sync.Mutex
	cuts    int // connections the server closed before their request was complete
}

func (a *attacker) cutOff() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cuts
}

// attack starts n connections from a to addr; they stop when ctx ends.
func (a *attacker) attack(ctx context.Context, wg *sync.WaitGroup, addr string, n int) {
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for a.hold(ctx, addr) && a.again {
			}
		}()
	}
}

// hold makes one trickling connection and reports whether the server
// cut it off (false: the attack ended, or the dial failed with it).
func (a *attacker) hold(ctx context.Context, addr string) bool {
	c, err := (&net.Dialer{LocalAddr: &net.TCPAddr{IP: a.from}}).DialContext(ctx, "tcp", addr)
	if err != nil {
		select { // not the server's doing: try again shortly
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
		return ctx.Err() == nil
	}
	defer c.Close()
	trickle := []byte(" ")
	if a.headers {
		fmt.Fprintf(c, "POST /webhooks/gitea HTTP/1.1\r\nHost: runway\r\n")
		trickle = []byte("X")
	} else {
		fmt.Fprintf(c, "POST /webhooks/gitea HTTP/1.1\r\nHost: runway\r\nContent-Type: application/json\r\n"+
			"X-Gitea-Event: workflow_job\r\nContent-Length: 100000\r\n\r\n{")
	}
	closed := make(chan struct{})
	go func() { io.Copy(io.Discard, c); close(closed) }() // EOF, a reset or an answer: the server is done with it
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			c.Close()
			<-closed
			return false
		case <-closed:
			a.mu.Lock()
			a.cuts++
			a.mu.Unlock()
			return true
		case <-tick.C:
			c.Write(trickle)
		}
	}
}

// delivery is a workflow_job delivery for job id, signed with secret and
// sent with the headers the Gitea contract server sends.
func delivery(t *testing.T, addr, secret string, id int64) *http.Request {
	t.Helper()
	body, err := json.Marshal(map[string]any{"action": "queued",
		"workflow_job": map[string]any{"id": id, "run_id": id, "name": "build", "labels": []string{"linux"}, "status": "queued",
			"url": fmt.Sprintf("http://gitea.example/api/v1/repos/acme/app/actions/jobs/%d", id), "created_at": time.Now().UTC().Format(time.RFC3339)},
		"repository": map[string]any{"full_name": "acme/app", "name": "app", "owner": map[string]any{"login": "acme"}}})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequest("POST", "http://"+addr+"/webhooks/gitea", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	sig := forge.Sign([]byte(secret), body)
	for k, v := range map[string]string{"Content-Type": "application/json", "X-Gitea-Event": "workflow_job", "X-Gitea-Event-Type": "workflow_job",
		"X-Gitea-Delivery": fmt.Sprintf("delivery-%d", id), "X-Gitea-Signature": sig, "X-Hub-Signature-256": "sha256=" + sig} {
		req.Header.Set(k, v)
	}
	return req
}

// probe is one delivery sent the way a forge sends it: a new connection,
// Gitea's 5 s timeout.
type probe struct {
	code int
	took time.Duration
	err  error
	held int // attackers' connections the server held when it answered
}

func deliver(t *testing.T, addr string, id int64, held func() int) probe {
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	start := time.Now()
	resp, err := client.Do(delivery(t, addr, hookSecret, id))
	p := probe{took: time.Since(start), err: err, held: held()}
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		p.code = resp.StatusCode
	}
	return p
}

// Sixteen connections from four addresses (four each: within the per-
// client share) fill the cap of 16 — two addresses trickle request
// bodies, two request headers — and reconnect whenever they are cut off.
// Eight signed deliveries, one every 250 ms, each on a new connection as
// a forge sends them, must each be answered 202 inside Gitea's 5 s while
// the attackers still hold most of the slots (the attack is not over:
// their requests would take hours, and no timeout has ended them), and
// the trickling connections must have been cut off to make room.
func TestTricklingClientsAtTheCapDoNotDelayDeliveries(t *testing.T) {
	d := testDaemon(t, "http: {max_connections: 16}")
	addr, held := serveHeld(t, d)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	var attackers []*attacker
	var ips []string
	for i := 2; i <= 5; i++ {
		a := &attacker{from: net.IPv4(127, 0, 0, byte(i)), again: true, headers: i > 3}
		a.attack(ctx, &wg, addr, 4)
		attackers, ips = append(attackers, a), append(ips, a.from.String())
	}
	waitFor(t, 10*time.Second, "the attackers' 16 connections accepted", func() bool { return held.from(ips...) >= 16 })
	var probes []probe
	pace := time.NewTicker(250 * time.Millisecond)
	defer pace.Stop()
	for id := range int64(8) {
		probes = append(probes, deliver(t, addr, 1000+id, func() int { return held.from(ips...) }))
		<-pace.C
	}
	stop()
	wg.Wait()
	var took []time.Duration
	for i, p := range probes {
		took = append(took, p.took)
		if p.err != nil || p.code != http.StatusAccepted {
			t.Errorf("delivery %d: %d %v after %s (the attackers held %d connections)", i, p.code, p.err, p.took.Round(time.Millisecond), p.held)
		} else if p.held < 8 {
			t.Errorf("delivery %d answered when the attackers held only %d of 16 connections: the attack had let go", i, p.held)
		}
	}
	slices.Sort(took)
	// Each kind of trickler must have been cut off. Which address loses
	// a connection is the cap's choice (the longest waiting first: the
	// attacker started last may lose none), so count by kind.
	cuts, byKind := 0, map[string]int{}
	for _, a := range attackers {
		cuts += a.cutOff()
		byKind[map[bool]string{true: "headers", false: "a body"}[a.headers]] += a.cutOff()
	}
	for _, kind := range []string{"headers", "a body"} {
		if byKind[kind] == 0 {
			t.Errorf("no connection trickling %s was cut off", kind)
		}
	}
	t.Logf("8 deliveries under the attack: median %s, max %s; %d trickling connections cut off",
		took[len(took)/2].Round(time.Microsecond), took[len(took)-1].Round(time.Microsecond), cuts)
	if n := scrape(t, addr, `runway_http_connections_cut_total{reason="stalled"}`); n == 0 {
		t.Error(`runway_http_connections_cut_total{reason="stalled"} did not count them`)
	}
}

// One address opening every slot with trickling connections keeps only
// its per-client share (a quarter of the cap by default): the rest are
// cut off, and a delivery is answered at once.
func TestOneClientCannotKeepEverySlot(t *testing.T) {
	addr, held := serveHeld(t, testDaemon(t, "http: {max_connections: 16}"))
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	a := &attacker{from: net.IPv4(127, 0, 0, 6)}
	a.attack(ctx, &wg, addr, 16)
	waitFor(t, 10*time.Second, "12 of the 16 connections cut off", func() bool { return a.cutOff() >= 12 })
	if n, open := a.cutOff(), held.from(a.from.String()); n != 12 || open != 4 {
		t.Errorf("%d connections cut off and %d held; want 12 and 4", n, open)
	}
	if p := deliver(t, addr, 1, func() int { return 0 }); p.err != nil || p.code != http.StatusAccepted {
		t.Errorf("delivery: %d %v after %s", p.code, p.err, p.took)
	}
}

// A request whose headers arrive at once but whose body trickles is cut
// off at read_body_timeout — answered 408 — long before read_timeout.
func TestTricklingBodyIsCutAtItsDeadline(t *testing.T) {
	addr := serve(t, testDaemon(t, "http: {read_body_timeout: 300ms, read_timeout: 1m}"))
	c := dial(t, addr)
	start := time.Now()
	fmt.Fprintf(c, "POST /webhooks/gitea HTTP/1.1\r\nHost: runway\r\nX-Gitea-Event: workflow_job\r\nContent-Length: 1000\r\n\r\n{")
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				if _, err := c.Write([]byte(" ")); err != nil {
					return
				}
			}
		}
	}()
	defer func() { close(stop); <-done }()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(c)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatalf("no answer to the trickling body: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if took := time.Since(start); resp.StatusCode != http.StatusRequestTimeout || took > 4*time.Second {
		t.Errorf("answered %d after %s; want 408 at the 300 ms body deadline", resp.StatusCode, took.Round(time.Millisecond))
	}
	// Then the server closes it (EOF, or a reset for our unread bytes).
	if _, err := r.ReadByte(); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("the connection stayed open after the 408: %v", err)
	}
}

// scrape reads one series' value from the daemon's /metrics (0: absent).
func scrape(t *testing.T, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			var n float64
			fmt.Sscan(v, &n)
			return n
		}
	}
	return 0
}

// waitFor polls cond (a condition wait) until it holds or fails t.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for: %s", timeout, what)
		}
	}
}
