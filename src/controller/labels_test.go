package controller

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/testkit/kubeyaml"
)

// The chart's default seed.defaultLabels.
var chartDefaults = []string{"ubuntu-latest:docker://node:16-bullseye", "ubuntu-22.04:docker://node:16-bullseye",
	"ubuntu-20.04:docker://node:16-bullseye", "ubuntu-18.04:docker://node:16-buster"}

// Seed 001's three shapes, applied unedited: the repo group without
// labels gets the default labels and claims a runs-on: ubuntu-latest
// job (the schema match); the global group's own ubuntu-latest
// overrides the default of that name, the others are added; the org
// group's app:infra — which a runner would not register as written — is
// refused on its status, naming the label and why, and never reaches
// the engine.
func TestSeedShapesLabels(t *testing.T) {
	f := newFakeCluster(t, SecretAccess{Names: []string{"gitea-auth-token", "gitea-registration-token"}})
	eng := &fakeEngine{states: map[string]GroupState{}}
	f.startSeed(t, eng, chartDefaults)
	var objs []*unstructured.Unstructured
	for _, u := range kubeyaml.Read(t, "testdata/seed-001-runnergroup.yaml") {
		if u.GetKind() == "Secret" {
			objs = append(objs, u)
		}
	}
	objs = append(objs, kubeyaml.Read(t, "testdata/seed-001-shapes.yaml")...)
	for _, u := range objs {
		f.create(t, u)
	}
	lib := eng.handedOver(t, engineName(kindSeed, f.ns, "lib"), "the repo group handed over")
	everywhere := eng.handedOver(t, engineName(kindSeed, f.ns, "everywhere"), "the global group handed over")
	if got := strings.Join(lib.Labels, ","); got != strings.Join(chartDefaults, ",") {
		t.Errorf("repo group without labels: %s, want the defaults", got)
	}
	if !forge.Match([]string{"ubuntu-latest"}, forge.NewLabelSet(lib.Labels)) {
		t.Error("runs-on: ubuntu-latest does not match the defaults' ubuntu-latest:docker://…")
	}
	if got := strings.Join(everywhere.Labels, ","); got != "ubuntu-latest,"+strings.Join(chartDefaults[1:], ",") {
		t.Errorf("global group: %s, want its ubuntu-latest and the other defaults", got)
	}
	waitFor(t, 10*time.Second, "the org group refused", func() bool { return f.ready(gvrs[kindSeed], "infra").Reason == ReasonInvalid })
	msg := f.ready(gvrs[kindSeed], "infra").Message
	if !strings.Contains(msg, `labels[0]: "app:infra" cannot be registered as written`) || !strings.Contains(msg, `write "app"`) {
		t.Errorf("org group's condition: %q", msg)
	}
	if _, _, ok := eng.group(engineName(kindSeed, f.ns, "infra")); ok {
		t.Error("the org group was handed to the engine")
	}
}

// The engine's runners that register and take no job: the group's
// Ready condition says so (RunnersNotTakingJobs) and each runner
// reported is a Warning event on it.
func TestNotTakingJobsOnTheObject(t *testing.T) {
	f := newFakeCluster(t, SecretAccess{Names: []string{"gitea-auth-token", "gitea-registration-token"}})
	eng := &fakeEngine{states: map[string]GroupState{}}
	ctl := f.start(t, eng)
	for _, u := range kubeyaml.Read(t, "testdata/seed-001-runnergroup.yaml") {
		f.create(t, u)
	}
	name := engineName(kindSeed, f.ns, "acme-linux")
	eng.handedOver(t, name, "handed over")
	eng.set(name, GroupState{ActiveRunners: 2, QueuedJobs: 5, NotTakingJobs: 2, LastCheckTime: time.Now()})
	waitFor(t, 10*time.Second, "Ready false: "+ReasonNotTakingJobs, func() bool {
		c := f.ready(gvrs[kindSeed], "acme-linux")
		return c.Reason == ReasonNotTakingJobs && strings.Contains(c.Message, "2 runners registered and took none of the 5 jobs")
	})
	ctl.RunnerEvent(name, name+"-abc", "not_taking", "online since …, it took none of the 5 jobs queued for them")
	waitFor(t, 10*time.Second, "a Warning event "+ReasonNotTakingJobs, func() bool {
		evs, _ := f.kube.CoreV1().Events(f.ns).List(context.Background(), metav1.ListOptions{})
		for _, ev := range evs.Items {
			if ev.Reason == ReasonNotTakingJobs && ev.Type == corev1.EventTypeWarning && ev.InvolvedObject.Name == "acme-linux" {
				return true
			}
		}
		return false
	})
}
