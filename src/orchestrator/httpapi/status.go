package httpapi

import (
	"fmt"
	"html/template"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/clip"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator"
)

type statusPage struct {
	Now     time.Time
	Groups  []statusGroup
	Runners []statusRunner
	Errors  []orchestrator.RecentError
}

type statusGroup struct {
	orchestrator.GroupStatus
	Plot    template.HTML
	Timings []statusTiming
}

// statusTiming is one duration kind's row (durations rounded for reading).
type statusTiming struct {
	Kind          string
	Count         int
	P50, P90, P99 string
}

func timings(ts []orchestrator.Timing) []statusTiming {
	out := make([]statusTiming, 0, len(ts))
	for _, t := range ts {
		row := statusTiming{Kind: t.Kind, Count: t.Count, P50: "-", P90: "-", P99: "-"}
		if t.Count > 0 {
			r := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
			row.P50, row.P90, row.P99 = r(t.P50), r(t.P90), r(t.P99)
		}
		out = append(out, row)
	}
	return out
}

type statusRunner struct {
	RunnerView
	Age string
	Job string
}

// plot draws queued jobs and runners of the last hour as an inline SVG.
func plot(samples []orchestrator.Sample, now time.Time) template.HTML {
	const w, h = 600, 120
	top := 1
	for _, s := range samples {
		top = max(top, s.Queued, s.Runners)
	}
	line := func(v func(orchestrator.Sample) int) string {
		var pts []string
		for _, s := range samples {
			x := float64(w) * (1 - now.Sub(s.At).Seconds()/orchestrator.HistorySpan.Seconds())
			y := float64(h-10) - float64(h-20)*float64(v(s))/float64(top)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x, y))
		}
		return strings.Join(pts, " ")
	}
	// Only numbers go into the SVG: nothing to escape.
	return template.HTML(fmt.Sprintf(`<svg class="plot" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="queued jobs and runners, last hour">`+
		`<rect width="%d" height="%d" fill="#fafafa" stroke="#ccc"/>`+
		`<polyline class="queued" fill="none" stroke="#d9534f" stroke-width="2" points="%s"/>`+
		`<polyline class="runners" fill="none" stroke="#337ab7" stroke-width="2" points="%s"/>`+
		`<text x="4" y="12" font-size="10">max %d</text>`+
		`<text x="4" y="%d" font-size="10">-60 min</text><text x="%d" y="%d" font-size="10" text-anchor="end">now</text></svg>`,
		w, h, w, h, w, h, line(func(s orchestrator.Sample) int { return s.Queued }), line(func(s orchestrator.Sample) int { return s.Runners }), top, h-2, w-4, h-2))
}

var statusTemplate = template.Must(template.New("status").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="10">
<title>runway</title>
<style>
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin-bottom:1.5em}td,th{border:1px solid #ddd;padding:.3em .6em;text-align:left}
th{background:#f0f0f0}.err{color:#a94442}.legend span{display:inline-block;margin-right:1em}
.q{color:#d9534f}.r{color:#337ab7}
</style></head><body>
<h1>runway</h1>
<p>As of {{.Now.Format "2006-01-02 15:04:05 MST"}}; refreshes every 10 s.</p>
<h2>Groups</h2>
<table id="groups"><tr><th>group</th><th>forge / scope</th><th>queued</th><th>runners (max)</th><th>creating</th><th>idle</th><th>busy</th><th>deleting</th><th>drained</th><th>here</th><th>last error</th></tr>
{{range .Groups}}<tr class="group" data-group="{{.Name}}"><td>{{.Name}}</td><td>{{.Forge}} / {{.Scope}}</td><td class="queued">{{.QueuedJobs}}</td><td class="runners">{{.ActiveRunners}} ({{.MaxActiveRunners}})</td><td>{{.Creating}}</td><td>{{.Idle}}</td><td>{{.Busy}}</td><td>{{.Deleting}}</td><td>{{.Drained}}</td><td class="acting">{{if .Acting}}acting{{else}}standby{{end}}</td><td class="err">{{.LastError}}</td></tr>
{{end}}</table>
{{range .Groups}}{{if .ScaleSet}}<h2>Scale set of group {{.Name}}</h2>{{end}}{{with .ScaleSet}}
<table class="scaleset" data-scale-set="{{.Name}}"><tr><th>scale set</th><th>session</th><th>available</th><th>assigned</th><th>running</th><th>registered</th><th>busy</th><th>idle</th><th>desired</th><th>flow</th><th>refused / dropped messages</th><th>last error</th></tr>
<tr><td>{{.Name}} ({{.ID}})</td><td class="session">{{if .Session}}open{{else if .Paused}}none (drained){{else}}none{{end}}</td><td>{{.AvailableJobs}}</td><td class="assigned">{{.AssignedJobs}}</td><td class="running">{{.RunningJobs}}</td><td>{{.RegisteredRunners}}</td><td>{{.BusyRunners}}</td><td>{{.IdleRunners}}</td><td class="desired">{{.DesiredRunners}}</td><td class="flow">{{.Flow}}</td><td>{{.RefusedMessages}} / {{.DroppedMessages}}</td><td class="err">{{.LastError}}{{if .Warning}} {{.Warning}}{{end}}</td></tr></table>
{{end}}{{end}}<h2>Queued jobs and runners, last hour</h2>
<p class="legend"><span class="q">&#9632; queued jobs</span><span class="r">&#9632; runners</span></p>
{{range .Groups}}<h3>{{.Name}}</h3>{{.Plot}}
<table class="timings" data-group="{{.Name}}"><tr><th>last hour</th><th>count</th><th>p50</th><th>p90</th><th>p99</th></tr>
{{range .Timings}}<tr class="timing" data-kind="{{.Kind}}"><td>{{.Kind}}</td><td class="count">{{.Count}}</td><td>{{.P50}}</td><td>{{.P90}}</td><td>{{.P99}}</td></tr>
{{end}}</table>
{{end}}
<p>Job queue: queued → started, job run: started → completed (the forge's dates, to the second); runner start-up: spawn → first seen online or running a job.</p>
<h2>Runners</h2>
<table id="runners"><tr><th>runner</th><th>group</th><th>state</th><th>age</th><th>job</th><th>VM</th></tr>
{{range .Runners}}<tr class="runner" data-state="{{.State}}"><td>{{.Name}}</td><td>{{.Group}}</td><td>{{.State}}</td><td>{{.Age}}</td><td>{{.Job}}</td><td>{{.VMCID}}</td></tr>
{{else}}<tr><td colspan="6">no runners</td></tr>
{{end}}</table>
<h2>Recent errors</h2>
<table id="errors"><tr><th>when</th><th>group</th><th>kind</th><th>error</th></tr>
{{range .Errors}}<tr class="error"><td>{{.At.Format "15:04:05"}}</td><td>{{.Group}}</td><td>{{.Kind}}</td><td class="err">{{.Message}}</td></tr>
{{else}}<tr><td colspan="4">none</td></tr>
{{end}}</table>
</body></html>
`))

// statusHandler serves the page: the same data as /api/v1 (and the same
// rule: reads are open), rendered on the server, no scripts.
func (a *api) status(w http.ResponseWriter, r *http.Request) {
	now := a.now()
	page := statusPage{Now: now}
	h := a.o.History()
	for _, g := range a.o.Groups() {
		g.LastError = clip.To(a.redact.Redact(g.LastError), 500)
		page.Groups = append(page.Groups, statusGroup{GroupStatus: g, Plot: plot(h.Samples(g.Name), now), Timings: timings(h.Timings(g.Name))})
	}
	page.Errors = h.Errors()
	rows, err := a.o.Store().Active("")
	if err != nil {
		http.Error(w, "runway.db: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	for _, x := range rows {
		v := view(x)
		sr := statusRunner{RunnerView: v, Age: now.Sub(x.CreatedAt).Round(time.Second).String()}
		switch {
		case x.JobID != 0:
			sr.Job = fmt.Sprintf("%s #%d", x.JobRepo, x.JobID)
		case x.TriggerJob != 0:
			sr.Job = fmt.Sprintf("(for #%d)", x.TriggerJob)
		}
		page.Runners = append(page.Runners, sr)
	}
	var b strings.Builder
	if err := statusTemplate.Execute(&b, page); err != nil {
		a.log.Warn("rendering the status page", "err", err)
		http.Error(w, "rendering the status page failed", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	io.WriteString(w, redactHTML(a.redact, b.String()))
}

// redactHTML passes a rendered page through the redactor, whatever field
// a URL or secret came in; the marker it leaves is escaped for HTML (the
// page's own text is escaped already, so a raw one is only the
// redactor's).
func redactHTML(r *logging.Redactor, page string) string {
	return strings.ReplaceAll(r.Redact(page), "<redacted>", "&lt;redacted&gt;")
}
