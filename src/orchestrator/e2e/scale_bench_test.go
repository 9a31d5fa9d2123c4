package e2e

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// BenchmarkScale is issue 29's measurement: RUNWAY_BENCH_JOBS (default
// 1,000) jobs queued at once with a webhook each, runway serve with room
// for all of them, each runner taking one job and exiting. It reports
// the time to the last runner online and to the last job done, queued →
// online p50/p99 (the forge's registration time of the runner that took
// the job), bin/cpi calls, forge API requests, the daemon's CPU seconds
// and peak memory, runners made beyond one per job and what is left.
// RUNWAY_BENCH_SPAWN sets spawn_concurrency (default 16). The "single"
// case is one job delivered by webhook to an idle daemon.
//
//	go test -run '^$' -bench Scale -benchtime 1x -timeout 30m ./src/orchestrator/e2e/
func BenchmarkScale(b *testing.B) {
	n := benchSetting("RUNWAY_BENCH_JOBS", 1000)
	for _, mode := range []string{"process", "container"} {
		b.Run(mode+"/single", func(b *testing.B) { scale(b, 1, mode) })
		b.Run(fmt.Sprintf("%s/jobs=%d", mode, n), func(b *testing.B) { scale(b, n, mode) })
	}
}

func scale(b *testing.B, n int, mode string) {
	spawn := benchSetting("RUNWAY_BENCH_SPAWN", 16)
	for range b.N {
		var e *env
		if mode == "container" {
			var registrations atomic.Int64
			// A /22: room for every runner of the burst at once.
			e = containerEnv(b, "10.252.0.0/22", "15s", &registrations)
		} else {
			e = newEnv(b)
		}
		e.sweep = "30s"
		e.writeConfig("15s", e.group("linux", "scope: org\n    org: acme", []string{"linux"}, max(n, 1),
			fmt.Sprintf("    spawn_concurrency: %d\n", spawn)))
		e.start()
		e.gitea.AddHook("http://"+e.addr+"/webhooks/gitea", []byte(webhookSecret))
		e.eventually(10*time.Second, "first pass done", func() bool { return !e.groupStatus("linux").LastCheckTime.IsZero() })
		// A first job uploads the stemcell (container mode unpacks the
		// rootfs): reported apart, as every later spawn reuses it.
		warm := time.Now()
		e.eventually(5*time.Minute, "the warm-up job completes", completed(e, e.gitea.AddJob("acme/app", "warm-up", []string{"linux"}, forge.StatusQueued)))
		e.eventually(time.Minute, "the warm-up VM is deleted", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
		b.ReportMetric(time.Since(warm).Seconds(), "warm-up-s")
		calls, creates := cpiCalls(e.metrics()), vmsMade(e.metrics())
		before := e.gitea.Requests()
		cpu0 := procCPU(e.daemon.Process.Pid)
		start := time.Now()
		jobs := make([]int64, n)
		for i := range jobs {
			jobs[i] = e.gitea.AddJob("acme/app", "job", []string{"linux"}, forge.StatusQueued)
		}
		e.eventually(30*time.Minute, "every job completes", completed(e, jobs...))
		done := time.Since(start)
		cpu := procCPU(e.daemon.Process.Pid) - cpu0
		peak := procPeakRSS(e.daemon.Process.Pid)
		var waits, takes, runs []time.Duration
		var lastOnline time.Time
		var slowest forgetest.GiteaJob
		for _, id := range jobs {
			j := e.gitea.Job(id)
			waits = append(waits, j.RunnerRegistered.Sub(j.Created))
			takes = append(takes, j.Started.Sub(j.RunnerRegistered))
			runs = append(runs, j.Completed.Sub(j.Started))
			if j.Started.Sub(j.RunnerRegistered) > slowest.Started.Sub(slowest.RunnerRegistered) {
				slowest = j
			}
			if j.RunnerRegistered.After(lastOnline) {
				lastOnline = j.RunnerRegistered
			}
		}
		slices.Sort(waits)
		// The runner slowest from registering to its job, and what the
		// daemon said of it: the tail to look into.
		b.Logf("slowest to take its job: %s, registered %s, first fetch %s later (%s), took job %d %s after registering\n%s", slowest.RunnerName,
			slowest.RunnerRegistered.Format("15:04:05.000"), slowest.RunnerFirstFetch.Sub(slowest.RunnerRegistered).Round(time.Millisecond),
			slowest.RunnerFirstFound, slowest.ID, slowest.Started.Sub(slowest.RunnerRegistered).Round(time.Millisecond),
			grep(e.stderr.String(), slowest.RunnerName))
		slices.Sort(takes)
		slices.Sort(runs)
		e.eventually(5*time.Minute, "every VM is deleted", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
		requests := 0
		for k, v := range e.gitea.Requests() {
			requests += v - before[k]
		}
		b.ReportMetric(lastOnline.Sub(start).Seconds(), "last-online-s")
		b.ReportMetric(done.Seconds(), "all-done-s")
		b.ReportMetric(waits[len(waits)/2].Seconds(), "online-p50-s")
		b.ReportMetric(waits[len(waits)*99/100].Seconds(), "online-p99-s")
		b.ReportMetric(takes[len(takes)*99/100].Seconds(), "online-to-job-p99-s")
		b.ReportMetric(takes[len(takes)-1].Seconds(), "online-to-job-max-s")
		b.ReportMetric(runs[len(runs)*99/100].Seconds(), "job-run-p99-s")
		b.ReportMetric(float64(cpiCalls(e.metrics())-calls), "cpi-calls")
		b.ReportMetric(float64(requests), "forge-requests")
		b.ReportMetric(cpu, "daemon-cpu-s")
		b.ReportMetric(float64(peak)/1024, "daemon-peak-MiB")
		b.ReportMetric(float64(vmsMade(e.metrics())-creates-n), "extra-runners")
		b.ReportMetric(float64(len(e.vms())+len(e.gitea.Runners())), "leftovers")
	}
}

var createCount = regexp.MustCompile(`(?m)^runway_cpi_call_seconds_count\{method="create_vm"\} (\d+)$`)

// vmsMade is how many create_vm calls /metrics counts.
func vmsMade(metrics string) int {
	m := createCount.FindStringSubmatch(metrics)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

var cpiCount = regexp.MustCompile(`(?m)^runway_cpi_call_seconds_count\{method="[a-z_]+"\} (\d+)$`)

// cpiCalls sums bin/cpi calls by every method from /metrics.
func cpiCalls(metrics string) int {
	n := 0
	for _, m := range cpiCount.FindAllStringSubmatch(metrics, -1) {
		v, _ := strconv.Atoi(m[1])
		n += v
	}
	return n
}

// procCPU is a process's user + system CPU seconds (USER_HZ 100).
func procCPU(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command's closing parenthesis: utime is the 12th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	u, _ := strconv.ParseFloat(f[11], 64)
	s, _ := strconv.ParseFloat(f[12], 64)
	return (u + s) / 100
}

// procPeakRSS is a process's peak resident set in KiB (VmHWM).
func procPeakRSS(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n
		}
	}
	return 0
}
