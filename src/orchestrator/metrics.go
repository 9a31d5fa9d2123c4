package orchestrator

import (
	"fmt"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics are the daemon's Prometheus series, on their own registry.
type Metrics struct {
	Registry           *prometheus.Registry
	queued             *prometheus.GaugeVec
	runners            *prometheus.GaugeVec
	spawnLatency       *prometheus.HistogramVec
	cpiDuration        *prometheus.HistogramVec
	cpiErrors          *prometheus.CounterVec
	forgeRequests      *prometheus.CounterVec
	forgeRateRemaining *prometheus.GaugeVec
	reconcileErrors    *prometheus.CounterVec
	webhooks           *prometheus.CounterVec
	httpCut            *prometheus.CounterVec
	foreignVMs         *prometheus.GaugeVec
	notTaking          *prometheus.GaugeVec
	acting             *prometheus.GaugeVec
	// The durations users watch, as actions-runner-controller's listener
	// exports them: job queue time, runner start-up time, job run time.
	jobQueue      *prometheus.HistogramVec
	runnerStartup *prometheus.HistogramVec
	jobRun        *prometheus.HistogramVec
	// A scale-set group's statistics, as ARC's listener exports them
	// (gha_assigned_jobs, …): by series name.
	scaleSetGauges map[string]*prometheus.GaugeVec
	// scaleSetDropped: messages a scale-set group's listener gave up on.
	scaleSetDropped *prometheus.CounterVec
}

// scaleSetSeries are the scale-set gauges and what each says.
var scaleSetSeries = map[string]string{
	"runway_scaleset_available_jobs":     "Jobs the scale set could take that nobody acquired (the Actions service's count).",
	"runway_scaleset_assigned_jobs":      "Jobs acquired by (assigned to) the group's scale set and not done.",
	"runway_scaleset_running_jobs":       "Jobs of the scale set a runner runs.",
	"runway_scaleset_registered_runners": "Runners registered in the scale set.",
	"runway_scaleset_busy_runners":       "Runners of the scale set running a job.",
	"runway_scaleset_idle_runners":       "Runners of the scale set online without a job.",
	"runway_scaleset_desired_runners":    "The runners the group plans: min(max_active_runners, busy runners + max(waiting jobs, min_idle)).",
	"runway_scaleset_session":            "1 while this process holds the scale set's message session.",
	"runway_scaleset_paused":             "1 while the group holds no session because it can hold no job (drained, retiring).",
}

// NewMetrics registers every series.
func NewMetrics() *Metrics {
	r := prometheus.NewRegistry()
	m := &Metrics{
		Registry: r,
		queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "runway_queued_jobs",
			Help: "Queued jobs this group claims (demand)."}, []string{"group"}),
		runners: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "runway_runners",
			Help: "Runners by group and state (spawning, idle, busy, deleting)."}, []string{"group", "state"}),
		spawnLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "runway_spawn_seconds",
			Help: "From spawn decision to create_vm answered.", Buckets: prometheus.ExponentialBuckets(0.01, 2.5, 12)}, []string{"group"}),
		cpiDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "runway_cpi_call_seconds",
			Help: "bin/cpi call duration by method.", Buckets: prometheus.ExponentialBuckets(0.002, 3, 12)}, []string{"method"}),
		cpiErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runway_cpi_call_errors_total",
			Help: "bin/cpi calls that failed, by method and error type."}, []string{"method", "type"}),
		forgeRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runway_forge_requests_total",
			Help: "Forge API requests by forge, HTTP method and status."}, []string{"forge", "method", "code"}),
		forgeRateRemaining: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "runway_forge_rate_limit_remaining",
			Help: "X-RateLimit-Remaining from the forge's last answer."}, []string{"forge"}),
		reconcileErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runway_reconcile_errors_total",
			Help: "Reconcile passes that failed, by group."}, []string{"group"}),
		webhooks: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runway_webhook_deliveries_total",
			Help: "Webhook deliveries by forge type and result."}, []string{"type", "result"}),
		httpCut: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runway_http_connections_cut_total",
			Help: "Connections the daemon closed on their client, by reason: idle or stalled (to make room at the cap), client_limit (stalled beyond the client's share), body_timeout."}, []string{"reason"}),
		foreignVMs: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "runway_foreign_vms",
			Help: "VMs of the group made by another state store (left alone)."}, []string{"group"}),
		notTaking: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "runway_runners_not_taking_jobs",
			Help: "Runners online at the forge that took none of the group's queued jobs within timeouts.pickup (the group makes no more meanwhile)."}, []string{"group"}),
		acting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "runway_group_acting",
			Help: "1 while this process acts for the group (replicas on PostgreSQL: one does)."}, []string{"group"}),
		jobQueue: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "runway_job_queue_seconds",
			Help: "From a job queued at the forge to a runner of the group taking it.", Buckets: durationBuckets}, []string{"group"}),
		runnerStartup: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "runway_runner_startup_seconds",
			Help: "From a runner's spawn (its row, before create_vm) to its registration seen at the forge or its first job.", Buckets: durationBuckets}, []string{"group"}),
		jobRun: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "runway_job_run_seconds",
			Help: "From a runner taking its job to the runner found finished.", Buckets: durationBuckets}, []string{"group"}),
		scaleSetDropped: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "runway_scaleset_dropped_messages_total",
			Help: "Scale set messages given up on, by group and reason: handling_failed (its handling failed every try), acquire_not_found (it offered jobs the service would not let the listener acquire)."}, []string{"group", "reason"}),
	}
	m.scaleSetGauges = map[string]*prometheus.GaugeVec{}
	for name, help := range scaleSetSeries {
		m.scaleSetGauges[name] = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, []string{"group"})
		r.MustRegister(m.scaleSetGauges[name])
	}
	r.MustRegister(m.queued, m.runners, m.spawnLatency, m.cpiDuration, m.cpiErrors, m.forgeRequests,
		m.forgeRateRemaining, m.reconcileErrors, m.webhooks, m.httpCut, m.foreignVMs, m.notTaking, m.acting, m.jobQueue, m.runnerStartup, m.jobRun, m.scaleSetDropped,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// durationBuckets span a quarter second to two hours: runner start-up
// and queue time sit at the low end, job run time anywhere.
var durationBuckets = prometheus.ExponentialBuckets(0.25, 2, 15)

// ObserveForge is a forge.Transport's observer for forge name: requests
// by method and status, and the rate limit left.
func (m *Metrics) ObserveForge(name string) func(method string, status int, h http.Header) {
	return func(method string, status int, h http.Header) {
		m.forgeRequests.WithLabelValues(name, method, fmt.Sprint(status)).Inc()
		if v := h.Get("X-RateLimit-Remaining"); v != "" {
			var n float64
			if _, err := fmt.Sscan(v, &n); err == nil {
				m.forgeRateRemaining.WithLabelValues(name).Set(n)
			}
		}
	}
}

// Webhook counts a delivery by forge type and result (accepted,
// duplicate, bad_signature, bad_payload, too_large, incomplete, ignored).
func (m *Metrics) Webhook(kind, result string) { m.webhooks.WithLabelValues(kind, result).Inc() }

// HTTPConnectionCut counts a connection the HTTP server closed on its
// client (reason: idle, stalled, client_limit, body_timeout).
func (m *Metrics) HTTPConnectionCut(reason string) { m.httpCut.WithLabelValues(reason).Inc() }

// scaleSet sets a scale-set group's gauges.
func (m *Metrics) scaleSet(group string, s *ScaleSetStatus) {
	session, paused := 0, 0
	if s.Session {
		session = 1
	}
	if s.Paused {
		paused = 1
	}
	for name, v := range map[string]int{"runway_scaleset_available_jobs": s.AvailableJobs, "runway_scaleset_assigned_jobs": s.AssignedJobs,
		"runway_scaleset_running_jobs": s.RunningJobs, "runway_scaleset_registered_runners": s.RegisteredRunners,
		"runway_scaleset_busy_runners": s.BusyRunners, "runway_scaleset_idle_runners": s.IdleRunners,
		"runway_scaleset_desired_runners": s.DesiredRunners, "runway_scaleset_session": session, "runway_scaleset_paused": paused} {
		m.scaleSetGauges[name].WithLabelValues(group).Set(float64(v))
	}
}
