package e2e

import (
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
)

// BenchmarkQueuedToRegistered is issue 31's measurement: 20 matching and 3
// non-matching jobs queued at once, the default poll and sweep intervals
// (15 s, 30 s), four runners at a time, so runners are reaped and replaced
// as they finish; with a webhook, and polling only. Per matching job:
// queued → the registration of the runner that took it, reported as p50,
// p90 and max seconds, and the time until all are done.
//
//	go test -run '^$' -bench QueuedToRegistered -benchtime 1x ./src/orchestrator/e2e/
func BenchmarkQueuedToRegistered(b *testing.B) {
	b.Run("webhook", func(b *testing.B) { queuedToRegistered(b, true) })
	b.Run("polling", func(b *testing.B) { queuedToRegistered(b, false) })
}

func queuedToRegistered(b *testing.B, webhook bool) {
	for range b.N {
		e := newEnv(b)
		e.sweep = "30s"
		e.writeConfig("15s", e.group("linux", "scope: org\n    org: acme", []string{"linux:host"}, 4, ""))
		e.start()
		if webhook {
			e.gitea.AddHook("http://"+e.addr+"/webhooks/gitea", []byte(webhookSecret))
		}
		e.eventually(10*time.Second, "first pass done", func() bool { return !e.groupStatus("linux").LastCheckTime.IsZero() })
		var jobs []int64
		for i := range 23 {
			if i%6 == 5 && i < 18 { // 3 of 23
				e.gitea.AddJob("acme/app", "job", []string{"windows"}, forge.StatusQueued)
				continue
			}
			jobs = append(jobs, e.gitea.AddJob("acme/app", "job", []string{"linux"}, forge.StatusQueued))
		}
		start := time.Now()
		e.eventually(10*time.Minute, "every matching job completes", completed(e, jobs...))
		took := time.Since(start)
		var waits []time.Duration
		for _, id := range jobs {
			j := e.gitea.Job(id)
			waits = append(waits, j.RunnerRegistered.Sub(j.Created))
		}
		slices.Sort(waits)
		b.ReportMetric(waits[len(waits)/2].Seconds(), "p50-s")
		b.ReportMetric(waits[len(waits)*9/10].Seconds(), "p90-s")
		b.ReportMetric(waits[len(waits)-1].Seconds(), "max-s")
		b.ReportMetric(took.Seconds(), "all-done-s")
		b.ReportMetric(float64(len(e.runners(true))), "runners")
	}
}

// benchSetting is the whole number in the environment variable name, or
// def when it is not set.
func benchSetting(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		n, _ := strconv.Atoi(v)
		return n
	}
	return def
}
