// Package faultproxy is a test-only HTTP proxy that sits in front of a
// real IaaS API and misbehaves on purpose: it throttles, answers 5xx and
// resets connections (before the request reaches the server, or after the
// server acted on it), and counts every request that passes. Drivers'
// fault-injection tests and request-count benchmarks run through it.
package faultproxy

import (
	"bytes"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// Fault is what the proxy does with one request.
type Fault int

const (
	Pass        Fault = iota // forward untouched
	Throttle                 // answer the IaaS's rate-limit error
	ServerError              // answer the IaaS's 5xx error
	ResetBefore              // reset the connection; the server never sees the request
	ResetAfter               // forward, then reset instead of answering: the server acted
)

func (f Fault) String() string {
	return [...]string{"pass", "throttle", "server-error", "reset-before", "reset-after"}[f]
}

// Reply is a canned answer.
type Reply struct {
	Status int
	Header http.Header
	Body   []byte
}

// Dialect says how one IaaS spells its errors.
type Dialect struct {
	Throttle    func(r *http.Request) Reply
	ServerError func(r *http.Request) Reply
	// Rewrite, if set, edits every passed response body; proxyURL is the
	// proxy's own base URL. OpenStack uses it to point the catalog's
	// endpoints back through the proxy.
	Rewrite func(body []byte, proxyURL string) []byte
}

// portPrefix routes a request to another port of the target's host:
// /_port/8774/v2.1/servers goes to target-host:8774/v2.1/servers. Clouds
// with one endpoint per service (OpenStack) sit behind one proxy this way.
const portPrefix = "/_port/"

// Request is what a Rule sees: the request, its body, and its sequence
// number (1-based) among all requests.
type Request struct {
	*http.Request
	Body []byte
	N    int64
}

// Rule decides the fault for one request.
type Rule func(Request) Fault

// Random faults a fraction of requests, choosing uniformly among kinds,
// from a seeded source so a failing run can be replayed.
func Random(rate float64, seed uint64, kinds ...Fault) Rule {
	var mu sync.Mutex
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	return func(Request) Fault {
		mu.Lock()
		defer mu.Unlock()
		if rng.Float64() >= rate || len(kinds) == 0 {
			return Pass
		}
		return kinds[rng.IntN(len(kinds))]
	}
}

// Proxy forwards to Target applying Rule.
type Proxy struct {
	Target  *url.URL
	Dialect Dialect

	mu     sync.Mutex
	rule   Rule
	n      atomic.Int64
	faults [5]atomic.Int64
	client *http.Client
}

// New makes a proxy to target that passes everything until SetRule.
func New(target string, d Dialect) (*Proxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	return &Proxy{Target: u, Dialect: d, client: &http.Client{
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}, nil
}

// SetRule replaces the rule (nil: pass everything).
func (p *Proxy) SetRule(r Rule) {
	p.mu.Lock()
	p.rule = r
	p.mu.Unlock()
}

// Requests is the number of requests received so far.
func (p *Proxy) Requests() int64 { return p.n.Load() }

// Faults is how many requests got fault f.
func (p *Proxy) Faults(f Fault) int64 { return p.faults[f].Load() }

// Start serves the proxy on 127.0.0.1; close it with the returned func.
func (p *Proxy) Start() (string, func()) {
	s := httptest.NewServer(p)
	return s.URL, s.Close
}

func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := p.n.Add(1)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p.mu.Lock()
	rule := p.rule
	p.mu.Unlock()
	f := Pass
	if rule != nil {
		f = rule(Request{Request: r, Body: body, N: n})
	}
	p.faults[f].Add(1)
	switch f {
	case Throttle:
		write(w, p.Dialect.Throttle(r))
		return
	case ServerError:
		write(w, p.Dialect.ServerError(r))
		return
	case ResetBefore:
		reset(w)
		return
	}
	target, path := p.Target, r.URL.Path
	if rest, ok := strings.CutPrefix(path, portPrefix); ok {
		port, tail, _ := strings.Cut(rest, "/")
		if _, err := strconv.Atoi(port); err != nil {
			http.Error(w, "faultproxy: bad port in "+path, http.StatusBadRequest)
			return
		}
		t := *p.Target
		t.Host = net.JoinHostPort(p.Target.Hostname(), port)
		t.Path = ""
		target, path = &t, "/"+tail
	}
	out, err := http.NewRequestWithContext(r.Context(), r.Method, target.ResolveReference(&url.URL{Path: path, RawQuery: r.URL.RawQuery}).String(), bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	out.Host = r.Host
	resp, err := p.client.Do(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	respBody, err := io.ReadAll(resp.Body)
	if f == ResetAfter || err != nil {
		reset(w)
		return
	}
	if p.Dialect.Rewrite != nil {
		respBody = p.Dialect.Rewrite(respBody, "http://"+r.Host)
		resp.Header.Del("Content-Length")
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(respBody)
}

func write(w http.ResponseWriter, r Reply) {
	for k, v := range r.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(r.Status)
	w.Write(r.Body)
}

// reset closes the client's connection with RST instead of FIN.
func reset(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		http.Error(w, "faultproxy: cannot reset this connection", http.StatusBadGateway)
		return
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		return
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	conn.Close()
}
