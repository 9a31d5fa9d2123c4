package e2e

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/runway-cpi/runway/src/testkit/forgetest"
	"github.com/runway-cpi/runway/src/testkit/kubeyaml"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// docs/kubernetes.md's install run as written (its settings the dev
// cluster's: two watched namespaces, the forge's host name by
// hostAliases); seed 001's example RunnerGroup and its three shapes
// applied unedited, against the Gitea contract server. The example: one
// runner pod per job, activeRunners and lastCheckTime moving,
// maxActiveRunners lowered and raised without a restart. The shapes: the
// global group with ubuntu-latest and the repo group without labels (in
// the second namespace: the defaults) run their jobs; the org group's
// app:infra is refused on its status, and its job gets no runner. The
// attacker's specs: a token naming the store's DSN Secret, forge URLs at
// the API server and the metadata address, a toleration of every taint —
// each refused with a clear status, nothing read, asked or made — and
// the Role and admission policy hold Runway's own account to its Secrets
// and runner service accounts. The leader killed (SIGKILL) and frozen
// (SIGSTOP) while runners are being made: another replica leads within
// 15 s, every job is run by one runner, and the frozen one, resumed,
// makes nothing. The example deleted: its pods and registrations gone.
func TestSeedShapesOnTheChart(t *testing.T) {
	c := clusterFor(t, "runway")
	testenv.Need(t, "scripts/k8s-dev start (this checkout's), then its $K8S_DEV_DIR/env", "RUNWAY_K8S_BIN", "RUNWAY_K8S_POD_CIDR",
		"RUNWAY_K8S_SERVICE_CIDR")
	seed := kubeyaml.Read(t, root+"/src/controller/testdata/seed-001-runnergroup.yaml")
	var token string
	var secrets []*unstructured.Unstructured
	for _, u := range seed {
		if u.GetName() == "gitea-auth-token" {
			token, _, _ = unstructured.NestedString(u.Object, "stringData", "token")
		}
		if u.GetKind() == "Secret" {
			secrets = append(secrets, u)
		}
	}
	gitea := forgetest.NewGitea(token)
	defer gitea.Close()
	var registrations atomic.Int64
	// The example's gitea.url: gitea.runway.test (hostAliases: the host's
	// end of the link), port 3000.
	c.serve(3000, counting(gitea.Config.Handler, &registrations))
	other := c.ns + "-b"
	if err := c.makeNamespace(other); err != nil {
		t.Fatal(err)
	}
	api, _ := url.Parse(os.Getenv("RUNWAY_K8S_API"))
	c.docInstall(c.postgres(), fmt.Sprintf(`
secrets: {names: [gitea-auth-token, gitea-registration-token, forge-token]}
watchNamespaces: [%s, %s]
forgeURLs: {deny: [%s, %s]}
kubernetesAPI: {host: %q, port: %q}
hostAliases: [{ip: %q, hostnames: [gitea.runway.test]}]
logLevel: debug
sweepInterval: 2s
seed: {pollInterval: 500ms}
runners: {deleteGraceSeconds: 1, waitTimeoutSeconds: 60}
`, c.ns, other, os.Getenv("RUNWAY_K8S_POD_CIDR"), os.Getenv("RUNWAY_K8S_SERVICE_CIDR"), api.Hostname(), api.Port(), c.hostIP))
	c.watchRunnerPods()
	c.apply(seed)
	c.applyIn(other, secrets)
	for _, u := range kubeyaml.Read(t, root+"/src/controller/testdata/seed-001-shapes.yaml") {
		if u.GetName() == "lib" {
			c.applyIn(other, []*unstructured.Unstructured{u})
		} else {
			c.apply([]*unstructured.Unstructured{u})
		}
	}
	hostile := c.hostileSpecs(token)
	gitea.AddJob("acme/tainted", "build", []string{"tainted"}, "queued")

	ctx := context.Background()
	status := func() (int64, string) {
		u, err := c.dyn.Resource(seedGVR).Namespace(c.ns).Get(ctx, "acme-linux", metav1.GetOptions{})
		if err != nil {
			return -1, ""
		}
		n, _, _ := unstructured.NestedInt64(u.Object, "status", "activeRunners")
		last, _, _ := unstructured.NestedString(u.Object, "status", "lastCheckTime")
		return n, last
	}
	c.waitFor(60*time.Second, "the group Ready with a lastCheckTime", func() bool { _, last := status(); return last != "" })
	hostile.check()

	// The shapes: the global and repo groups run their jobs; the org
	// group's app:infra job gets no runner.
	made0 := c.podsMade()
	shapeJobs := []int64{gitea.AddJob("other/tool", "build", []string{"ubuntu-latest"}, "queued"),
		gitea.AddJob("acme/lib", "build", []string{"ubuntu-22.04"}, "queued")}
	infraJob := gitea.AddJob("acme/infra", "deploy", []string{"app:infra"}, "queued")
	c.waitFor(120*time.Second, "the global and repo shapes' jobs completed", func() bool {
		return gitea.Job(shapeJobs[0]).Status == "completed" && gitea.Job(shapeJobs[1]).Status == "completed"
	})
	c.waitFor(60*time.Second, "every runner pod gone", func() bool { return c.runnerPods() == 0 })
	if cond := c.condition(seedGVR, c.ns, "infra"); cond["reason"] != "Invalid" ||
		!strings.Contains(fmt.Sprint(cond["message"]), `"app:infra" cannot be registered as written`) {
		t.Errorf("the org shape's condition: %v", cond)
	}
	if j := gitea.Job(infraJob); j.Status != "queued" || c.podsMade()-made0 != 2 {
		t.Errorf("app:infra job %s; %d runner pods made for the two shape jobs, want 2", j.Status, c.podsMade()-made0)
	}
	t.Logf("seed shapes: global (ubuntu-latest) and repo (no labels, in %s) ran their jobs; org app:infra refused: %v", other,
		c.condition(seedGVR, c.ns, "infra")["message"])

	jobs := func(n int) []int64 {
		var ids []int64
		for range n {
			ids = append(ids, gitea.AddJob("acme/app", "build", []string{"linux"}, "queued"))
		}
		return ids
	}
	// done waits for the jobs to complete, sampling the runner pods (at
	// most max at once) and activeRunners (seen above 0).
	done := func(ids []int64, max int, what string) (most int) {
		sawActive := false
		c.waitFor(120*time.Second, what, func() bool {
			if n := c.runnerPods(); n > most {
				most = n
			}
			if n, _ := status(); n > 0 {
				sawActive = true
			}
			return gitea.Completed(ids...)
		})
		if most > max {
			t.Errorf("%s: %d runner pods at once, maxActiveRunners %d", what, most, max)
		}
		if !sawActive {
			t.Errorf("%s: status.activeRunners never above 0", what)
		}
		return most
	}
	_, last0 := status()
	made0, regs0 := c.podsMade(), registrations.Load()
	first := jobs(3)
	done(first, 2, "three jobs with maxActiveRunners 2")
	c.waitFor(60*time.Second, "every runner pod gone", func() bool { return c.runnerPods() == 0 })
	if _, last := status(); last == last0 {
		t.Errorf("lastCheckTime stayed %s", last)
	}
	if n, m := registrations.Load()-regs0, c.podsMade()-made0; n != 3 || m != 3 {
		t.Errorf("3 jobs: %d registrations, %d runner pods made; want 3 and 3", n, m)
	}

	patch := func(max int) {
		t.Helper()
		p := []byte(`{"spec":{"maxActiveRunners":` + itoa(max) + `}}`)
		if _, err := c.dyn.Resource(seedGVR).Namespace(c.ns).Patch(ctx, "acme-linux", "application/merge-patch+json", p, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch(1)
	done(jobs(3), 1, "three jobs with maxActiveRunners lowered to 1")
	patch(4)
	if most := done(jobs(4), 4, "four jobs with maxActiveRunners raised to 4"); most < 2 {
		t.Errorf("maxActiveRunners raised to 4: at most %d runner pod at once", most)
	}
	c.waitFor(60*time.Second, "every runner pod gone", func() bool { return c.runnerPods() == 0 })
	if made, regs := c.podsMade()-made0, registrations.Load()-regs0; made != 10 || regs != 10 {
		t.Errorf("10 jobs so far: %d runner pods made, %d registrations", made, regs)
	}

	c.killLeaderMidSpawn(gitea, &registrations, c.podsMade())
	c.freezeLeaderMidSpawn(gitea, &registrations, c.podsMade())

	if err := c.dyn.Resource(seedGVR).Namespace(c.ns).Delete(ctx, "acme-linux", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	c.waitFor(120*time.Second, "the RunnerGroup gone", func() bool { n, _ := status(); return n == -1 })
	if n := c.runnerPods(); n != 0 {
		t.Errorf("%d runner pods left after the group was deleted", n)
	}
	if rs := gitea.Runners(); len(rs) != 0 {
		t.Errorf("registrations left after the group was deleted: %+v", rs)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
