package e2e

import (
	"fmt"
	"sort"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// BenchmarkHundredJobs: 100 GitHub jobs queued at once (webhooks to the
// leader) for one RunnerGroup of up to 100 runners on the dev kubelet:
// the time until 100 runner pods have been Running, and so the cost of
// one pod (docs/benchmarks.md, beside the driver's create_vm → Running).
//
//	go test -run '^$' -bench HundredJobs -benchtime 1x ./src/controller/e2e
func BenchmarkHundredJobs(b *testing.B) {
	c := newCluster(b)
	image := c.pushRunwayImage()
	c.pushRunnerImage()
	const token, hook = "bench-forge-token-0123456789", "bench-hook-secret-0123456789"
	gh := forgetest.NewGitHub(token)
	defer gh.Close()
	gh.URL = c.serve(0, gh.Config.Handler)
	c.install(image, c.postgres(), "secrets.names={forges}")
	c.watchRunnerPods()
	c.apply(parseYAML(b, fmt.Sprintf(`
apiVersion: v1
kind: Secret
metadata: {name: forges}
stringData: {token: %s, hook: %s}
---
apiVersion: runway.io/v1alpha1
kind: Forge
metadata: {name: github}
spec: {type: github, url: %q, runnerURL: %q, token: {name: forges, key: token}, webhookSecret: {name: forges, key: hook}}
---
apiVersion: runway.io/v1alpha1
kind: RunnerGroup
metadata: {name: burst}
spec:
  forge: github
  scope: repo
  repo: acme/app
  labels: [self-hosted, linux]
  maxActiveRunners: 100
  spawnConcurrency: 16
  image: %s
  runner: {command: /usr/local/bin/runner}
`, token, hook, gh.URL, gh.URL, c.runnerImg)))
	c.waitFor(90*time.Second, "the group Ready", func() bool { return c.ready(groupGVR, "burst") })
	gh.AddHook(c.webhookURL()+"/webhooks/github", []byte(hook))
	b.ResetTimer()
	start := time.Now()
	var ids []int64
	for range 100 {
		ids = append(ids, gh.AddJob("acme/app", []string{"self-hosted", "linux"}))
	}
	c.waitFor(5*time.Minute, "100 runner pods Running", func() bool {
		c.podsMu.Lock()
		defer c.podsMu.Unlock()
		return len(c.running) >= 100
	})
	c.podsMu.Lock()
	var at []time.Duration
	for _, t := range c.running {
		at = append(at, t.Sub(start))
	}
	c.podsMu.Unlock()
	sort.Slice(at, func(i, j int) bool { return at[i] < at[j] })
	total := at[99]
	b.StopTimer()
	c.waitFor(10*time.Minute, "the 100 jobs completed", func() bool { return gh.Completed(ids...) })
	b.ReportMetric(total.Seconds(), "s/100-pods")
	b.ReportMetric(total.Seconds()/100, "s/pod")
	b.Logf("100 jobs queued → 100 runner pods Running: %s (first %s, median %s); %.2f s a pod; %d pods made",
		total.Round(10*time.Millisecond), at[0].Round(10*time.Millisecond), at[49].Round(10*time.Millisecond),
		total.Seconds()/100, c.podsMade())
}
