package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// BenchmarkScaleSet is issue 40's measurement, process mode, no webhook
// and an hour's poll (nothing inbound, no REST listing), on each flow the
// Actions service speaks (flow=github.com: jobs assigned by the service;
// flow=ghes: offered, then acquired — issue 47):
//
//   - single: 20 jobs one after another into an idle daemon; queued →
//     the runner that took it online (its first call-in), p50 and max;
//
//   - jobs=N (RUNWAY_BENCH_JOBS, 1,000): N jobs queued at once through
//     one scale set with room for all, as BenchmarkScale does by webhook
//     (RUNWAY_BENCH_SPAWN spawn_concurrency, 16): last online, all done,
//     online p50/p99, bin/cpi calls, REST and Actions service requests,
//     the daemon's CPU and peak memory, extra runners, leftovers;
//
//   - at-rest: REST requests while nothing happens for 30 s, and what
//     one renewal of the admin connection costs (the only REST a scale
//     set's session needs: its admin token, and so its refreshes, rest on
//     it).
//
//     go test -run '^$' -bench ScaleSet -benchtime 1x -timeout 30m ./src/orchestrator/e2e/
func BenchmarkScaleSet(b *testing.B) {
	n := benchSetting("RUNWAY_BENCH_JOBS", 1000)
	for _, flow := range []forgetest.ActionsFlow{forgetest.FlowGitHubCom, forgetest.FlowGHES} {
		b.Run("flow="+flow.String(), func(b *testing.B) {
			b.Run("single", func(b *testing.B) { scaleSetSingle(b, flow) })
			b.Run(fmt.Sprintf("jobs=%d", n), func(b *testing.B) { scaleSetBurst(b, flow, n) })
		})
	}
	b.Run("at-rest", func(b *testing.B) { scaleSetAtRest(b) })
}

// restRequests counts requests to GitHub's REST API (not the Actions
// service, not the runners' stand-in) since before.
func restRequests(gh *forgetest.GitHub, before map[string]int) (rest, actions int) {
	for k, v := range gh.Requests() {
		_, path, _ := strings.Cut(k, " ")
		switch {
		case strings.HasPrefix(path, "/_runner/"):
		case strings.HasPrefix(path, "/_services/"):
			actions += v - before[k]
		default:
			rest += v - before[k]
		}
	}
	return rest, actions
}

// benchScaleSetEnv is a started scale-set daemon with room for max
// runners, its stemcell uploaded by a warm-up job.
func benchScaleSetEnv(b *testing.B, flow forgetest.ActionsFlow, max int) (*env, *forgetest.GitHub) {
	spawn := benchSetting("RUNWAY_BENCH_SPAWN", 16)
	e, gh := scaleSetEnv(b, flow, max, fmt.Sprintf("    spawn_concurrency: %d\n", spawn))
	e.sweep = "30s"
	e.writeConfig("", e.group("ss", "scope: org\n    org: acme", []string{"runway-ss"}, max,
		fmt.Sprintf("    demand: scale_set\n    spawn_concurrency: %d\n", spawn)))
	e.start()
	warm := gh.AddJob("acme/app", []string{"runway-ss"})
	e.eventually(5*time.Minute, "the warm-up job completes", func() bool { return gh.Job(warm).Status == "completed" })
	e.eventually(time.Minute, "the warm-up VM is deleted", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	return e, gh
}

func scaleSetSingle(b *testing.B, flow forgetest.ActionsFlow) {
	for range b.N {
		e, gh := benchScaleSetEnv(b, flow, 4)
		before := gh.Requests()
		var waits []time.Duration
		for range 20 {
			id := gh.AddJob("acme/app", []string{"runway-ss"})
			e.eventually(time.Minute, "the job completes", func() bool { return gh.Job(id).Status == "completed" })
			j := gh.Job(id)
			waits = append(waits, j.RunnerOnline.Sub(j.Created))
			e.eventually(time.Minute, "its VM is deleted", func() bool { return len(e.vms()) == 0 })
		}
		slices.Sort(waits)
		b.ReportMetric(waits[len(waits)/2].Seconds(), "online-p50-s")
		b.ReportMetric(waits[len(waits)-1].Seconds(), "online-max-s")
		rest, actions := restRequests(gh, before)
		b.ReportMetric(float64(rest), "rest-requests")
		b.ReportMetric(float64(actions), "actions-requests")
	}
}

func scaleSetBurst(b *testing.B, flow forgetest.ActionsFlow, n int) {
	for range b.N {
		e, gh := benchScaleSetEnv(b, flow, n)
		calls, creates := cpiCalls(e.metrics()), vmsMade(e.metrics())
		before := gh.Requests()
		cpu0 := procCPU(e.daemon.Process.Pid)
		start := time.Now()
		jobs := make([]int64, n)
		for i := range jobs {
			jobs[i] = gh.AddJob("acme/app", []string{"runway-ss"})
		}
		e.eventually(30*time.Minute, "every job completes", func() bool { return gh.Completed(jobs...) })
		done := time.Since(start)
		cpu, peak := procCPU(e.daemon.Process.Pid)-cpu0, procPeakRSS(e.daemon.Process.Pid)
		var waits []time.Duration
		var lastOnline time.Time
		for _, id := range jobs {
			j := gh.Job(id)
			waits = append(waits, j.RunnerOnline.Sub(j.Created))
			if j.RunnerOnline.After(lastOnline) {
				lastOnline = j.RunnerOnline
			}
		}
		slices.Sort(waits)
		e.eventually(5*time.Minute, "every VM is deleted", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
		rest, actions := restRequests(gh, before)
		b.ReportMetric(lastOnline.Sub(start).Seconds(), "last-online-s")
		b.ReportMetric(done.Seconds(), "all-done-s")
		b.ReportMetric(waits[len(waits)/2].Seconds(), "online-p50-s")
		b.ReportMetric(waits[len(waits)*99/100].Seconds(), "online-p99-s")
		b.ReportMetric(float64(cpiCalls(e.metrics())-calls), "cpi-calls")
		b.ReportMetric(float64(rest), "rest-requests")
		b.ReportMetric(float64(actions), "actions-requests")
		b.ReportMetric(cpu, "daemon-cpu-s")
		b.ReportMetric(float64(peak)/1024, "daemon-peak-MiB")
		b.ReportMetric(float64(vmsMade(e.metrics())-creates-n), "extra-runners")
		b.ReportMetric(float64(len(e.vms())+gh.RunnerCount()), "leftovers")
	}
}

func scaleSetAtRest(b *testing.B) {
	for range b.N {
		e, gh := scaleSetEnv(b, forgetest.FlowGitHubCom, 4, "")
		e.start()
		e.eventually(30*time.Second, "the session", func() bool {
			ss := e.groupStatus("ss").ScaleSet
			return ss != nil && ss.Session
		})
		before := gh.Requests()
		time.Sleep(30 * time.Second) // the window measured: nothing happens in it
		rest, actions := restRequests(gh, before)
		b.ReportMetric(float64(rest), "rest-requests-30s")
		b.ReportMetric(float64(actions), "actions-requests-30s")
		// One admin renewal: a token about to expire is renewed at its
		// next use (the session's refresh, here).
		gh.SetActionsTimes(61*time.Second, 0, time.Second) // short polls: the expired token is met at once
		e.stop(false)
		e.start()
		e.eventually(30*time.Second, "the session", func() bool {
			ss := e.groupStatus("ss").ScaleSet
			return ss != nil && ss.Session
		})
		before = gh.Requests()
		renewals0 := before["POST /actions/runner-registration"]
		gh.ExpireSessionTokens() // the next poll refreshes, on a renewed admin token
		e.eventually(30*time.Second, "a refresh", func() bool { return gh.ActionsStats().Refreshes > 0 })
		rest, _ = restRequests(gh, before)
		renewals := gh.Requests()["POST /actions/runner-registration"] - renewals0
		b.ReportMetric(float64(rest), "rest-per-refresh")
		b.ReportMetric(float64(renewals), "admin-renewals")
	}
}
