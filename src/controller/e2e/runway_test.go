package e2e

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/runway-cpi/runway/src/testkit/forgetest"
	"github.com/runway-cpi/runway/src/testkit/kubeyaml"
)

// Runway's own resources on the chart: a GitHub Forge with a webhook
// secret and a Forgejo Forge (polled), a RunnerGroup of each; GitHub jobs
// reach the leader by webhook (the Service's endpoint) and each gets one
// runner pod (its JIT config) — queued job to runner pod Running
// measured; Forgejo jobs get one REST-registered runner each; both
// groups deleted: no pod and no registration left. Then 100 groups: the
// controller's memory.
func TestRunwayResourcesOnTheChart(t *testing.T) {
	c := newCluster(t)
	const token, hook = "e2e-forge-token-0123456789", "e2e-hook-secret-0123456789"
	gh := c.gitHubOnTheChart(token, hook, "gha", 3, "")
	fj := forgetest.NewForgejo(token)
	defer fj.Close()
	var fjRegs atomic.Int64
	fjURL := c.serve(0, counting(fj.Config.Handler, &fjRegs))
	c.apply(parseYAML(t, fmt.Sprintf(`
apiVersion: runway.io/v1alpha1
kind: Forge
metadata: {name: forgejo}
spec: {type: forgejo, url: %q, token: {name: forges, key: token}, pollInterval: 500ms}
---
apiVersion: runway.io/v1alpha1
kind: RunnerGroup
metadata: {name: fj}
spec:
  forge: forgejo
  scope: org
  org: acme
  labels: [linux]
  maxActiveRunners: 3
  image: %s
  runner: {command: /usr/local/bin/runner}
`, fjURL, c.runnerImg)))
	c.waitFor(90*time.Second, "fj Ready", func() bool { return c.ready(groupGVR, "fj") })

	// Queued (the delivery leaves at once) → the runner pod Running, one
	// job at a time: measured and logged for docs/benchmarks.md, not
	// asserted (a loaded machine is slower; the target is the benchmark's).
	var lat []time.Duration
	for i := range 10 {
		before := c.podNames()
		start := time.Now()
		id := gh.AddJob("acme/app", []string{"self-hosted", "linux"})
		c.waitFor(30*time.Second, "a runner pod for GitHub job "+strconv.Itoa(i), func() bool { return c.newRunning(before) != "" })
		lat = append(lat, time.Since(start))
		c.waitFor(60*time.Second, "the GitHub job completed", func() bool { return gh.Job(id).Status == "completed" })
	}
	sort.Slice(lat, func(a, b int) bool { return lat[a] < lat[b] })
	t.Logf("GitHub job queued (webhook) → runner pod Running, 10 jobs: p50 %s, max %s", lat[len(lat)/2].Round(time.Millisecond),
		lat[len(lat)-1].Round(time.Millisecond))

	var fjJobs []int64
	for range 3 {
		fjJobs = append(fjJobs, fj.AddJob("acme/lib", "build", []string{"linux"}, "queued"))
	}
	c.waitFor(120*time.Second, "the Forgejo jobs completed", func() bool { return fj.Completed(fjJobs...) })
	if n := fjRegs.Load(); n != 0 {
		t.Errorf("Forgejo runners registered with a token %d times; they are registered by the REST API", n)
	}

	c.measureMemory("github")

	ctx := context.Background()
	for _, name := range []string{"gha", "fj"} {
		if err := c.dyn.Resource(groupGVR).Namespace(c.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	c.waitFor(120*time.Second, "both groups gone", func() bool {
		a, _ := c.dyn.Resource(groupGVR).Namespace(c.ns).Get(ctx, "gha", metav1.GetOptions{})
		b, _ := c.dyn.Resource(groupGVR).Namespace(c.ns).Get(ctx, "fj", metav1.GetOptions{})
		return a == nil && b == nil
	})
	if n := c.runnerPods(); n != 0 {
		t.Errorf("%d runner pods left", n)
	}
	if n := gh.RunnerCount(); n != 0 {
		t.Errorf("%d GitHub runners left registered", n)
	}
	if rs := fj.Runners(); len(rs) != 0 {
		t.Errorf("Forgejo runners left registered: %+v", rs)
	}
}

// BenchmarkHundredJobs: 100 GitHub jobs queued at once (webhooks to the
// leader) for one RunnerGroup of up to 100 runners on the dev kubelet:
// the time until 100 runner pods have been Running, and so the cost of
// one pod (docs/benchmarks.md, beside the driver's create_vm → Running).
//
//	go test -run '^$' -bench HundredJobs -benchtime 1x ./src/controller/e2e
func BenchmarkHundredJobs(b *testing.B) {
	c := newCluster(b)
	const token, hook = "bench-forge-token-0123456789", "bench-hook-secret-0123456789"
	gh := c.gitHubOnTheChart(token, hook, "burst", 100, "spawnConcurrency: 16")
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

// gitHubOnTheChart installs the chart (Runway's and the runner's images
// pushed, its store, Secret forges allowed; runner pods watched) with
// Forge github, a contract server served where pods reach it (the JIT
// configs name it), its token and webhook secret in Secret forges, and
// RunnerGroup group of it (acme/app's self-hosted, linux jobs, up to
// maxActive runners; extra: one more spec line). Once the group is Ready
// the server's webhook goes to the leader.
func (c *cluster) gitHubOnTheChart(token, hook, group string, maxActive int, extra string) *forgetest.GitHub {
	image := c.pushRunwayImage()
	c.pushRunnerImage()
	gh := forgetest.NewGitHub(token)
	c.t.Cleanup(gh.Close)
	gh.URL = c.serve(0, gh.Config.Handler)
	c.install(image, c.postgres(), "secrets.names={forges}")
	c.watchRunnerPods()
	c.apply(parseYAML(c.t, fmt.Sprintf(`
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
metadata: {name: %s}
spec:
  forge: github
  scope: repo
  repo: acme/app
  labels: [self-hosted, linux]
  maxActiveRunners: %d
  image: %s
  runner: {command: /usr/local/bin/runner}
  %s
`, token, hook, gh.URL, gh.URL, group, maxActive, c.runnerImg, extra)))
	c.waitFor(90*time.Second, group+" Ready", func() bool { return c.ready(groupGVR, group) })
	gh.AddHook(c.webhookURL()+"/webhooks/github", []byte(hook))
	return gh
}

func parseYAML(t testing.TB, doc string) []*unstructured.Unstructured {
	return kubeyaml.Parse(t, []byte(doc))
}

// ready: the object's Ready condition is True.
func (c *cluster) ready(gvr schema.GroupVersionResource, name string) bool {
	u, err := c.dyn.Resource(gvr).Namespace(c.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return false
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, cd := range conds {
		if m := cd.(map[string]any); m["type"] == "Ready" && m["status"] == "True" {
			return true
		}
	}
	return false
}

// webhookURL is where the webhook Service sends deliveries: its endpoint
// (the leader's pod; this cluster has no kube-proxy, the host routes to
// pods through the node).
func (c *cluster) webhookURL() string {
	var ip string
	c.waitFor(30*time.Second, "the webhook Service's endpoint", func() bool {
		slices, err := c.kube.DiscoveryV1().EndpointSlices(c.ns).List(context.Background(),
			metav1.ListOptions{LabelSelector: "kubernetes.io/service-name=" + c.fullname()})
		if err != nil {
			return false
		}
		var ips []string
		for _, s := range slices.Items {
			for _, ep := range s.Endpoints {
				if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
					ips = append(ips, ep.Addresses...)
				}
			}
		}
		if len(ips) != 1 {
			return false
		}
		ip = ips[0]
		return true
	})
	return "http://" + ip + ":8480"
}

// podNames are the runner pods seen made so far.
func (c *cluster) podNames() map[string]bool {
	c.podsMu.Lock()
	defer c.podsMu.Unlock()
	out := map[string]bool{}
	for n := range c.pods {
		out[n] = true
	}
	return out
}

// newRunning is a runner pod not among before that the watch saw Running
// or already done ("" until one is): a runner that takes its job at once
// can end before a List sees it Running, as one did on a loaded machine.
func (c *cluster) newRunning(before map[string]bool) string {
	c.podsMu.Lock()
	defer c.podsMu.Unlock()
	for n := range c.running {
		if !before[n] {
			return n
		}
	}
	return ""
}

// measureMemory makes 100 more groups and reads the leader's resident
// memory once each is Ready.
func (c *cluster) measureMemory(forge string) {
	t := c.t
	ctx := context.Background()
	var b strings.Builder
	for i := range 100 {
		fmt.Fprintf(&b, `---
apiVersion: runway.io/v1alpha1
kind: RunnerGroup
metadata: {name: load-%d}
spec: {forge: %s, scope: repo, repo: acme/r%d, labels: [self-hosted, x%d], maxActiveRunners: 1, image: %s, runner: {command: /usr/local/bin/runner}}
`, i, forge, i, i, c.runnerImg)
	}
	c.apply(parseYAML(t, b.String()))
	c.waitFor(180*time.Second, "100 more groups Ready", func() bool {
		for i := range 100 {
			if !c.ready(groupGVR, fmt.Sprintf("load-%d", i)) {
				return false
			}
		}
		return true
	})
	pod, _, _ := strings.Cut(c.leader(), "_")
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", processOf(t, pod)))
	if err != nil {
		t.Fatal(err)
	}
	kib := map[string]int{}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			kib[strings.TrimSuffix(f[0], ":")], _ = strconv.Atoi(f[1])
		}
	}
	// Anonymous memory is the process's own (heap, stacks); file-backed
	// pages are the 70 MB executable's, shared with the page cache.
	t.Logf("the leader's memory with 102 groups: resident %.1f MiB, of which anonymous %.1f MiB and file-backed %.1f MiB",
		float64(kib["VmRSS"])/1024, float64(kib["RssAnon"])/1024, float64(kib["RssFile"])/1024)
	if kib["RssAnon"] == 0 || kib["RssAnon"] > 64*1024 {
		t.Errorf("the leader's own (anonymous) memory with 102 groups: %.1f MiB, want at most 64 MiB", float64(kib["RssAnon"])/1024)
	}
	for i := range 100 {
		c.dyn.Resource(groupGVR).Namespace(c.ns).Delete(ctx, fmt.Sprintf("load-%d", i), metav1.DeleteOptions{})
	}
	c.waitFor(120*time.Second, "the 100 groups gone", func() bool {
		l, err := c.dyn.Resource(groupGVR).Namespace(c.ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) <= 2
	})
}
