package e2e

import (
	"bytes"
	"context"
	"io"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// readObjects reads a multi-document YAML file, unedited.
func readObjects(t testing.TB, path string) []*unstructured.Unstructured {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(b), 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err == io.EOF {
			return out
		} else if err != nil {
			t.Fatal(err)
		}
		if m != nil {
			out = append(out, &unstructured.Unstructured{Object: m})
		}
	}
}

// The chart installed on the dev cluster; seed 001's example RunnerGroup
// and its two Secrets applied unedited; jobs queued on the Gitea contract
// server each get one runner pod, which runs its job and goes;
// status.activeRunners and lastCheckTime move; maxActiveRunners lowered
// and raised is honoured without a restart; the leader killed while
// runners are being made: the other replica takes over within 15 s with
// no job run twice, no runner made twice and nothing left; the resource
// deleted: its pods and registrations gone, then the resource.
func TestSeedRunnerGroupOnTheChart(t *testing.T) {
	c := newCluster(t)
	image := c.pushRunwayImage()
	c.pushRunnerImage()
	seed := readObjects(t, root+"/src/controller/testdata/seed-001-runnergroup.yaml")
	var token string
	for _, u := range seed {
		if u.GetName() == "gitea-auth-token" {
			token, _, _ = unstructured.NestedString(u.Object, "stringData", "token")
		}
	}
	gitea := forgetest.NewGitea(token)
	defer gitea.Close()
	var registrations atomic.Int64
	// The example's gitea.url: the host's end of the link, port 3000.
	c.serve(3000, counting(gitea.Config.Handler, &registrations))
	c.install(image, c.postgres(), "secrets.names={gitea-auth-token,gitea-registration-token}")
	c.watchRunnerPods()
	c.apply(seed)

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
			for _, id := range ids {
				if gitea.Job(id).Status != "completed" {
					return false
				}
			}
			return true
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
	first := jobs(3)
	done(first, 2, "three jobs with maxActiveRunners 2")
	c.waitFor(60*time.Second, "every runner pod gone", func() bool { return c.runnerPods() == 0 })
	if _, last := status(); last == last0 {
		t.Errorf("lastCheckTime stayed %s", last)
	}
	if n := registrations.Load(); n != 3 || c.podsMade() != 3 {
		t.Errorf("3 jobs: %d registrations, %d runner pods made; want 3 and 3", n, c.podsMade())
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
	made, regs := c.podsMade(), registrations.Load()
	if made != 10 || regs != 10 {
		t.Errorf("10 jobs so far: %d runner pods made, %d registrations", made, regs)
	}

	c.killLeaderMidSpawn(gitea, &registrations, made)

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
