// Package httpapi is `runway serve`'s HTTP surface: the JSON API, the
// status page, /metrics, /healthz and the forges' webhook endpoints. It
// reads and drives the orchestrator through its exported methods only.
package httpapi

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator"
	"github.com/runway-cpi/runway/src/orchestrator/config"
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
	OnlineAt   time.Time `json:"online_at,omitzero"` // first seen online at the forge or busy
}

func view(r store.Runner) RunnerView {
	return RunnerView{Name: r.Name, Group: r.Group, State: r.State, VMCID: r.VMCID, AgentID: r.AgentID,
		TriggerJob: r.TriggerJob, JobID: r.JobID, JobRepo: r.JobRepo, ForgeID: r.ForgeRunnerID, Reason: r.Reason,
		LastError: r.LastError, CreatedAt: r.CreatedAt, StateAt: r.StateAt, OnlineAt: r.OnlineAt}
}

const maxWebhookBody = 5 << 20

// api is the handlers' state.
type api struct {
	o      *orchestrator.Orchestrator
	cfg    *config.Config
	log    logging.Fields
	redact *logging.Redactor
	now    func() time.Time
}

// Handler serves the daemon's HTTP interface for o. now stamps the
// status page (nil: time.Now).
func Handler(o *orchestrator.Orchestrator, cfg *config.Config, log logging.Fields, redact *logging.Redactor, now func() time.Time) (http.Handler, error) {
	admin, err := secret.Read(cfg.AdminTokenFile, "", "admin_token_file", redact)
	if err != nil {
		return nil, err
	}
	if now == nil {
		now = time.Now
	}
	a := &api{o: o, cfg: cfg, log: log, redact: redact, now: now}
	mux := http.NewServeMux()
	// Every answer but /metrics (label values: configured names) passes
	// through the one redactor: JSON and text here, the page in status.
	mux.HandleFunc("GET /healthz", a.redacted(func(w http.ResponseWriter, r *http.Request) {
		if err := o.Store().Check(); err != nil {
			http.Error(w, err.Error()+": the daemon stopped acting; restore the file and restart", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "ok\n")
	}))
	mux.HandleFunc("GET /{$}", a.status)
	mux.Handle("GET /metrics", promhttp.HandlerFor(o.Metrics().Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /api/v1/groups", a.redacted(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, o.Groups())
	}))
	mux.HandleFunc("GET /api/v1/runners", a.redacted(a.runners))
	// Without an admin token, drain and resume are for the local host only.
	openAdmin := admin == "" && loopbackListen(cfg.Listen)
	drain := func(v bool) http.HandlerFunc {
		return a.redacted(func(w http.ResponseWriter, r *http.Request) {
			if admin == "" && !openAdmin {
				writeJSON(w, http.StatusForbidden, map[string]string{"error": "drain and resume need admin_token_file when listen (" + cfg.Listen + ") is not a loopback address"})
				return
			}
			if admin != "" && subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte("Bearer "+admin)) != 1 {
				writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "admin token required"})
				return
			}
			st, err := o.SetDrained(r.PathValue("name"), v)
			if err != nil {
				writeJSON(w, http.StatusNotFound, map[string]string{"error": err.Error()})
				return
			}
			writeJSON(w, http.StatusOK, st)
		})
	}
	mux.HandleFunc("POST /api/v1/groups/{name}/drain", drain(true))
	mux.HandleFunc("POST /api/v1/groups/{name}/resume", drain(false))
	mux.HandleFunc("POST /webhooks/gitea", a.redacted(a.webhook("gitea", "X-Gitea-Event", "X-Gitea-Delivery")))
	mux.HandleFunc("POST /webhooks/github", a.redacted(a.webhook("github", "X-GitHub-Event", "X-GitHub-Delivery")))
	return mux, nil
}

// runners serves /api/v1/runners: the live runners (?group=), or the
// last 1000 with history (?all=true).
func (a *api) runners(w http.ResponseWriter, r *http.Request) {
	var rows []store.Runner
	var err error
	if r.URL.Query().Get("all") == "true" {
		rows, err = a.o.Store().All(1000)
	} else {
		rows, err = a.o.Store().Active(r.URL.Query().Get("group"))
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
}

// redacted passes every byte h writes through the redactor: every URL's
// user info and query values, every registered secret — in any field,
// now or added later. (Whole writes: writeJSON and http.Error write once.)
func (a *api) redacted(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		h(redactingWriter{ResponseWriter: w, out: a.redact.Writer(w)}, r)
	}
}

type redactingWriter struct {
	http.ResponseWriter
	out io.Writer
}

func (w redactingWriter) Write(p []byte) (int, error) { return w.out.Write(p) }

func (a *api) webhook(kind, eventHeader, deliveryHeader string) http.HandlerFunc {
	o, m := a.o, a.o.Metrics()
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, maxWebhookBody+1))
		switch {
		case len(body) > maxWebhookBody:
			m.Webhook(kind, "too_large")
			http.Error(w, "body too large", http.StatusRequestEntityTooLarge)
			return
		case err != nil:
			// Cut off: past read_body_timeout, or to make room at the cap.
			m.Webhook(kind, "incomplete")
			http.Error(w, "body not received in time", http.StatusRequestTimeout)
			return
		}
		event := r.Header.Get(eventHeader)
		delivery := r.Header.Get(deliveryHeader)
		if event != "workflow_job" {
			// Pings and other events: acknowledged once signed, not acted on.
			if o.SignedBy(kind, body, r.Header) == "" {
				m.Webhook(kind, "bad_signature")
				a.log.Warn("webhook rejected: bad signature", "type", kind, "event", event, "delivery", delivery, "remote", r.RemoteAddr)
				http.Error(w, "bad signature", http.StatusUnauthorized)
				return
			}
			m.Webhook(kind, "ignored")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		name, ev, err := o.Webhook(kind, delivery, body, r.Header)
		switch {
		case errors.Is(err, orchestrator.ErrDuplicate):
			// A redelivery: answered, not acted on twice.
			m.Webhook(kind, "duplicate")
			a.log.Debug("webhook redelivered: ignored", "type", kind, "delivery", delivery)
			w.WriteHeader(http.StatusAccepted)
		case errors.Is(err, orchestrator.ErrBadSignature):
			m.Webhook(kind, "bad_signature")
			a.log.Warn("webhook rejected: bad signature", "type", kind, "delivery", delivery, "remote", r.RemoteAddr)
			http.Error(w, "bad signature", http.StatusUnauthorized)
		case err != nil:
			m.Webhook(kind, "bad_payload")
			http.Error(w, err.Error(), http.StatusBadRequest)
		default:
			m.Webhook(kind, "accepted")
			a.log.Debug("webhook", "forge", name, "action", ev.Action, "job", ev.Job.ID, "repo", ev.Job.Repo, "delivery", delivery)
			w.WriteHeader(http.StatusAccepted)
		}
	}
}

// writeJSON writes v in one write (what redacted needs), '<' and '&'
// as they are: a redacted URL reads "?token=<redacted>".
func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
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
