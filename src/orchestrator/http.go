package orchestrator

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/runway-cpi/runway/src/orchestrator/secret"
	"github.com/runway-cpi/runway/src/orchestrator/store"
)

// RunnerView is one runner as /api/v1/runners shows it.
type RunnerView struct {
	Name       string    `json:"name"`
	Group      string    `json:"group"`
	State      string    `json:"state"`
	VMCID      string    `json:"vm_cid,omitempty"`
	AgentID    string    `json:"agent_id"`
	TriggerJob int64     `json:"trigger_job,omitempty"`
	JobID      int64     `json:"job_id,omitempty"`
	JobRepo    string    `json:"job_repo,omitempty"`
	ForgeID    int64     `json:"forge_runner_id,omitempty"`
	Reason     string    `json:"reason,omitempty"`
	LastError  string    `json:"last_error,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	StateAt    time.Time `json:"state_at"`
}

func view(r store.Runner) RunnerView {
	return RunnerView{Name: r.Name, Group: r.Group, State: r.State, VMCID: r.VMCID, AgentID: r.AgentID,
		TriggerJob: r.TriggerJob, JobID: r.JobID, JobRepo: r.JobRepo, ForgeID: r.ForgeRunnerID, Reason: r.Reason,
		LastError: r.LastError, CreatedAt: r.CreatedAt, StateAt: r.StateAt}
}

// Groups returns every group's status.
func (o *Orchestrator) Groups() []GroupStatus {
	out := make([]GroupStatus, 0, len(o.groups))
	for _, g := range o.groups {
		out = append(out, g.Status())
	}
	return out
}

const maxWebhookBody = 5 << 20

// Handler serves the daemon's HTTP interface.
func (o *Orchestrator) Handler() (http.Handler, error) {
	admin, err := secret.Read(o.cfg.AdminTokenFile, "", "admin_token_file", o.redact)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if err := o.store.Check(); err != nil {
			http.Error(w, err.Error()+": the daemon stopped acting; restore the file and restart", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /{$}", o.statusHandler)
	mux.Handle("GET /metrics", promhttp.HandlerFor(o.metrics.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /api/v1/groups", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, o.Groups())
	})
	mux.HandleFunc("GET /api/v1/runners", func(w http.ResponseWriter, r *http.Request) {
		var rows []store.Runner
		var err error
		if r.URL.Query().Get("all") == "true" {
			rows, err = o.store.All(1000)
		} else {
			rows, err = o.store.Active(r.URL.Query().Get("group"))
		}
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error()})
			return
		}
		out := make([]RunnerView, 0, len(rows))
		for _, x := range rows {
			out = append(out, view(x))
		}
		writeJSON(w, http.StatusOK, out)
	})
	// Without an admin token, drain and resume are for the local host only.
	openAdmin := admin == "" && loopbackListen(o.cfg.Listen)
	drain := func(v bool) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if admin == "" && !openAdmin {
				writeJSON(w, http.StatusForbidden, map[string]string{"error": "drain and resume need admin_token_file when listen (" + o.cfg.Listen + ") is not a loopback address"})
				return
			}
			if admin != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+admin)) != 1 {
				writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "admin token required"})
				return
			}
			if err := o.SetDrained(r.PathValue("name"), v); err != nil {
				writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
				return
			}
			writeJSON(w, http.StatusOK, o.group(r.PathValue("name")).Status())
		}
	}
	mux.HandleFunc("POST /api/v1/groups/{name}/drain", drain(true))
	mux.HandleFunc("POST /api/v1/groups/{name}/resume", drain(false))
	mux.HandleFunc("POST /webhooks/gitea", o.webhook("gitea", "X-Gitea-Event", "X-Gitea-Delivery"))
	mux.HandleFunc("POST /webhooks/github", o.webhook("github", "X-GitHub-Event", "X-GitHub-Delivery"))
	return mux, nil
}

func (o *Orchestrator) webhook(kind, eventHeader, deliveryHeader string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxWebhookBody+1))
		if err != nil || len(body) > maxWebhookBody {
			o.metrics.webhooks.WithLabelValues(kind, "too_large").Inc()
			http.Error(w, "body too large or unreadable", http.StatusRequestEntityTooLarge)
			return
		}
		event := r.Header.Get(eventHeader)
		delivery := r.Header.Get(deliveryHeader)
		if event != "workflow_job" {
			// Pings and other events: acknowledged once signed, not acted on.
			if o.signedBy(kind, body, r.Header) == "" {
				o.metrics.webhooks.WithLabelValues(kind, "bad_signature").Inc()
				o.log.Warn("webhook rejected: bad signature", "type", kind, "event", event, "delivery", delivery, "remote", r.RemoteAddr)
				http.Error(w, "bad signature", http.StatusUnauthorized)
				return
			}
			o.metrics.webhooks.WithLabelValues(kind, "ignored").Inc()
			w.WriteHeader(http.StatusNoContent)
			return
		}
		name, ev, err := o.Webhook(kind, delivery, body, r.Header)
		switch {
		case errors.Is(err, ErrDuplicate):
			// A redelivery: answered, not acted on twice.
			o.metrics.webhooks.WithLabelValues(kind, "duplicate").Inc()
			o.log.Debug("webhook redelivered: ignored", "type", kind, "delivery", delivery)
			w.WriteHeader(http.StatusAccepted)
		case errors.Is(err, ErrBadSignature):
			o.metrics.webhooks.WithLabelValues(kind, "bad_signature").Inc()
			o.log.Warn("webhook rejected: bad signature", "type", kind, "delivery", delivery, "remote", r.RemoteAddr)
			http.Error(w, "bad signature", http.StatusUnauthorized)
		case err != nil:
			o.metrics.webhooks.WithLabelValues(kind, "bad_payload").Inc()
			http.Error(w, err.Error(), http.StatusBadRequest)
		default:
			o.metrics.webhooks.WithLabelValues(kind, "accepted").Inc()
			o.log.Debug("webhook", "forge", name, "action", ev.Action, "job", ev.Job.ID, "repo", ev.Job.Repo, "delivery", delivery)
			w.WriteHeader(http.StatusAccepted)
		}
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// loopbackListen reports whether addr (host:port) listens on loopback only.
func loopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// maxDeliveries bounds the memory of deliveries seen.
const maxDeliveries = 4096

// seenDelivery records a delivery id (of a signed delivery: a forger must
// not burn the id of one yet to come) and reports whether it was seen
// before.
func (o *Orchestrator) seenDelivery(kind, id string) bool {
	if id == "" {
		return false
	}
	key := kind + "/" + id
	o.deliveryMu.Lock()
	defer o.deliveryMu.Unlock()
	if o.deliveries == nil {
		o.deliveries = map[string]bool{}
	}
	if o.deliveries[key] {
		return true
	}
	if len(o.deliveryOrder) >= maxDeliveries {
		delete(o.deliveries, o.deliveryOrder[0])
		o.deliveryOrder = o.deliveryOrder[1:]
	}
	o.deliveries[key] = true
	o.deliveryOrder = append(o.deliveryOrder, key)
	return false
}

// Serve serves h on ln with the configured timeouts and connection cap
// until ctx ends, then shuts down within 5 s.
func (o *Orchestrator) Serve(ctx context.Context, ln net.Listener, h http.Handler) error {
	c := o.cfg.HTTP
	lim := newConnLimit(ln, c.MaxConnections)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: c.ReadHeaderTimeout.Duration, ReadTimeout: c.ReadTimeout.Duration,
		WriteTimeout: c.WriteTimeout.Duration, IdleTimeout: c.IdleTimeout.Duration, MaxHeaderBytes: 64 << 10,
		ConnState: lim.track}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lim) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(shut)
}

// connLimit is the listener with the connection cap: at most max open,
// but idle keep-alive connections never keep a new client out — when the
// cap is reached, Accept closes the longest idle one to make room, and
// only when every connection is busy with a request does it wait (as
// netutil.LimitListener always would).
type connLimit struct {
	net.Listener
	mu     sync.Mutex
	cond   *sync.Cond
	max    int
	open   int
	closed bool
	idle   map[*limitedConn]time.Time // idle since
}

func newConnLimit(ln net.Listener, max int) *connLimit {
	l := &connLimit{Listener: ln, max: max, idle: map[*limitedConn]time.Time{}}
	l.cond = sync.NewCond(&l.mu)
	return l
}

func (l *connLimit) Accept() (net.Conn, error) {
	l.mu.Lock()
	for l.open >= l.max && !l.closed {
		if v := l.longestIdle(); v != nil {
			delete(l.idle, v)
			l.mu.Unlock()
			_ = v.Close() // frees its place, and wakes us
			l.mu.Lock()
			continue
		}
		l.cond.Wait() // a connection closes or goes idle
	}
	if l.closed {
		l.mu.Unlock()
		return nil, net.ErrClosed
	}
	l.open++
	l.mu.Unlock()
	c, err := l.Listener.Accept()
	if err != nil {
		l.release()
		return nil, err
	}
	return &limitedConn{Conn: c, l: l}, nil
}

func (l *connLimit) Close() error {
	l.mu.Lock()
	l.closed = true
	l.cond.Broadcast()
	l.mu.Unlock()
	return l.Listener.Close()
}

func (l *connLimit) release() {
	l.mu.Lock()
	l.open--
	l.cond.Broadcast()
	l.mu.Unlock()
}

func (l *connLimit) longestIdle() *limitedConn {
	var best *limitedConn
	var since time.Time
	for c, t := range l.idle {
		if best == nil || t.Before(since) {
			best, since = c, t
		}
	}
	return best
}

// track is the server's ConnState hook: which connections are idle.
func (l *connLimit) track(c net.Conn, s http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s == http.StateIdle {
		l.idle[lc] = time.Now()
		l.cond.Broadcast()
		return
	}
	delete(l.idle, lc)
}

type limitedConn struct {
	net.Conn
	l    *connLimit
	once sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.idle, c)
		c.l.mu.Unlock()
		c.l.release()
	})
	return c.Conn.Close()
}
