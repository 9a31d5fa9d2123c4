package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/testkit/kubeyaml"
)

// fixture drives reconcile by hand, as kubernetes/sample-controller's
// controller_test.go does: objects go into client-go's fake clients and
// the informers' caches (no informer runs), one key is synced, and what
// it did is read from the clients' actions, the events recorded and the
// engine's set. The watch's part — an object written coming back into
// the cache — is the test's: refresh.
type fixture struct {
	t      *testing.T
	f      *fakeCluster
	eng    Engine
	ctl    *Controller
	events *record.FakeRecorder
}

func newFixture(t *testing.T, eng Engine, access SecretAccess) *fixture {
	f := newFakeCluster(t, access)
	ctl := New(Options{Kube: f.kube, Dyn: f.dyn, Namespaces: []string{f.ns}, Secrets: access, Engine: eng,
		Seed: Seed{Image: "registry.example/act_runner:1", Command: "/bin/runner"}, Log: logging.Fields{Logger: logging.Discard()}})
	events := record.NewFakeRecorder(16)
	ctl.recorder = events
	return &fixture{t: t, f: f, eng: eng, ctl: ctl, events: events}
}

// add puts objects in the fake API server and the informers' caches.
func (x *fixture) add(yaml string) {
	x.t.Helper()
	for _, u := range kubeyaml.Parse(x.t, []byte(yaml)) {
		if u.GetKind() == "Secret" {
			x.f.create(x.t, u)
			s, err := x.f.kube.Tracker().Get(corev1.SchemeGroupVersion.WithResource("secrets"), x.f.ns, u.GetName())
			if err != nil {
				x.t.Fatal(err)
			}
			if inf := x.ctl.secrets[[2]string{x.f.ns, u.GetName()}]; inf != nil {
				inf.GetStore().Add(s)
			}
			continue
		}
		x.f.create(x.t, u)
		x.refresh(kindKey(u), u.GetName())
	}
}

// refresh brings the object as the API server has it into the cache.
func (x *fixture) refresh(kind, name string) *unstructured.Unstructured {
	x.t.Helper()
	u, err := x.f.dyn.Resource(gvrs[kind]).Namespace(x.f.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		x.t.Fatal(err)
	}
	if err := x.ctl.infs[kind][x.f.ns].GetStore().Update(u); err != nil {
		x.t.Fatal(err)
	}
	return u
}

// sync reconciles one object, then brings it back into the cache.
func (x *fixture) sync(kind, name string) error {
	x.t.Helper()
	x.f.dyn.ClearActions()
	err := x.ctl.reconcile(context.Background(), keyOf(kind, x.f.ns, name))
	x.refresh(kind, name)
	return err
}

// patched answers the patches the last sync sent, as "subresource body".
func (x *fixture) patched() []string {
	var out []string
	for _, a := range x.f.dyn.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok {
			out = append(out, p.GetSubresource()+" "+string(p.GetPatch()))
		}
	}
	return out
}

const forgeAndSecret = `
apiVersion: v1
kind: Secret
metadata: {name: gh}
stringData: {token: ghp-token-0123456789, hook: hook-secret-0123456789}
---
apiVersion: runway.io/v1alpha1
kind: Forge
metadata: {name: github}
spec: {type: github, url: "https://api.github.com", token: {name: gh, key: token}, webhookSecret: {name: gh, key: hook}}
`

func runwayGroupYAML(name, repo string) string {
	return fmt.Sprintf(`{apiVersion: runway.io/v1alpha1, kind: RunnerGroup, metadata: {name: %s, generation: 1},
 spec: {forge: github, scope: repo, repo: %s, labels: [self-hosted], maxActiveRunners: 2, image: i, runner: {command: /r}, spawnConcurrency: 4, demand: forge}}`, name, repo)
}

// One Runway RunnerGroup through reconcile, step by step: the finalizer
// first; waiting for its Forge (ForgeMissing, naming spec.forge, nothing
// handed over); handed over with the Forge's Secrets once it exists, the
// forge asked once, the engine's counts on the status and Ready; a
// runner's failure an Event whose message keeps no secret; deleted, the
// group retired and the finalizer kept until the engine says nothing is
// left, then released.
func TestReconcileRunnerGroup(t *testing.T) {
	eng := &fakeEngine{states: map[string]GroupState{}}
	x := newFixture(t, eng, SecretAccess{Names: []string{"gh"}})
	x.add(runwayGroupYAML("arm", "acme/app"))
	if err := x.sync(kindGroup, "arm"); err != nil {
		t.Fatal(err)
	}
	if p := x.patched(); len(p) != 1 || !strings.HasPrefix(p[0], ` {"metadata":{"finalizers":["`+Finalizer+`"]`) {
		t.Fatalf("first sync: patches %q, want the finalizer alone", p)
	}
	if err := x.sync(kindGroup, "arm"); err != nil {
		t.Fatal(err)
	}
	if c := x.f.ready(gvrs[kindGroup], "arm"); c.Reason != ReasonForgeMissing || !strings.Contains(c.Message, "spec.forge: no Forge team-a/github") {
		t.Errorf("without its Forge: %+v", c)
	}
	if _, groups, _ := x.ctl.set(); len(groups) != 0 {
		t.Errorf("handed over without its Forge: %+v", groups)
	}

	x.add(forgeAndSecret)
	if err := x.sync(kindForge, "github"); err != nil {
		t.Fatal(err)
	}
	if c := x.f.ready(gvrs[kindForge], "github"); c.Status != metav1.ConditionTrue {
		t.Errorf("the Forge: %+v", c)
	}
	name := engineName(kindGroup, x.f.ns, "arm")
	eng.set(name, GroupState{ActiveRunners: 2, QueuedJobs: 1, Idle: 1, Busy: 1})
	if err := x.sync(kindGroup, "arm"); err != nil {
		t.Fatal(err)
	}
	g, fc, ok := eng.group(name)
	if !ok || g.Repo != "acme/app" || fc.Secrets.Token() != "ghp-token-0123456789" || fc.Secrets.WebhookSecret() != "hook-secret-0123456789" {
		t.Fatalf("handed over: %v %+v, forge %+v", ok, g, fc)
	}
	u := x.refresh(kindGroup, "arm")
	c := x.f.ready(gvrs[kindGroup], "arm")
	active, _, _ := unstructured.NestedInt64(u.Object, "status", "activeRunners")
	busy, _, _ := unstructured.NestedInt64(u.Object, "status", "busy")
	gen, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
	if c.Status != metav1.ConditionTrue || active != 2 || busy != 1 || gen != 1 {
		t.Errorf("status: Ready %+v, activeRunners %d, busy %d, observedGeneration %d", c, active, busy, gen)
	}
	// Nothing changed: no status written, the forge not asked again.
	if err := x.sync(kindGroup, "arm"); err != nil {
		t.Fatal(err)
	}
	if p := x.patched(); len(p) != 0 || len(eng.checked) != 1 {
		t.Errorf("an unchanged group: patches %q, forge asked %d times", p, len(eng.checked))
	}

	x.ctl.RunnerEvent(name, name+"-1", "failed", "create_vm: token ghp-token-0123456789 refused")
	select {
	case ev := <-x.events.Events:
		if !strings.HasPrefix(ev, "Warning RunnerFailed runner "+name+"-1") || strings.Contains(ev, "ghp-token") {
			t.Errorf("event %q", ev)
		}
	default:
		t.Error("no event for the runner's failure")
	}

	now := metav1.Now()
	u.SetDeletionTimestamp(&now)
	if _, err := x.f.dyn.Resource(gvrs[kindGroup]).Namespace(x.f.ns).Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	x.refresh(kindGroup, "arm")
	if err := x.sync(kindGroup, "arm"); err != nil {
		t.Fatal(err)
	}
	g, _, _ = eng.group(name)
	fins := x.refresh(kindGroup, "arm").GetFinalizers()
	if c := x.f.ready(gvrs[kindGroup], "arm"); !g.Retire || c.Reason != ReasonDeleting || !slices.Contains(fins, Finalizer) {
		t.Errorf("deleted: retire %v, Ready %+v, finalizers %v", g.Retire, c, fins)
	}
	eng.set(name, GroupState{Retired: true})
	if err := x.sync(kindGroup, "arm"); err != nil {
		t.Fatal(err)
	}
	if fins := x.refresh(kindGroup, "arm").GetFinalizers(); slices.Contains(fins, Finalizer) {
		t.Errorf("the engine retired the group, the finalizer is kept: %v", fins)
	}
}

// refusingEngine refuses, as the engine's Replace does, every set with
// a group named in refuse.
type refusingEngine struct {
	*fakeEngine
	refuse func(i int, g config.GroupConfig) error
}

func (r refusingEngine) Replace(forges []config.ForgeConfig, groups []config.GroupConfig) error {
	for i, g := range groups {
		if err := r.refuse(i, g); err != nil {
			return fmt.Errorf("replace: %w", err)
		}
	}
	return r.fakeEngine.Replace(forges, groups)
}

// A set the engine refuses for one group's field (a typed refusal with
// the list and index of the group at fault): that group alone is marked
// Invalid, its status naming the field, and the rest handed over. A
// refusal of a forge is nobody's group: the hand-over fails and is
// retried, no group marked.
func TestEngineRefusalNamesTheGroup(t *testing.T) {
	fake := &fakeEngine{states: map[string]GroupState{}}
	refused := engineName(kindGroup, "team-a", "b")
	eng := refusingEngine{fake, func(i int, g config.GroupConfig) error {
		if g.Name != refused {
			return nil
		}
		return &orchestrator.IdentityError{FieldError: config.FieldError{Field: fmt.Sprintf("groups[%d].repo", i),
			Msg: "cannot change while the group exists", List: "groups", Index: i}}
	}}
	x := newFixture(t, eng, SecretAccess{Names: []string{"gh"}})
	x.add(forgeAndSecret)
	if err := x.sync(kindForge, "github"); err != nil {
		t.Fatal(err)
	}
	// a, b and c sort so: b, the one refused, is groups[1].
	for _, n := range []string{"a", "b", "c"} {
		x.add(runwayGroupYAML(n, "acme/"+n))
		for range 2 { // the finalizer, then the rest
			if err := x.sync(kindGroup, n); err != nil {
				t.Fatalf("%s: %v", n, err)
			}
		}
	}
	for _, n := range []string{"a", "c"} {
		if _, _, ok := fake.group(engineName(kindGroup, x.f.ns, n)); !ok {
			t.Errorf("group %s not handed over beside the refused one", n)
		}
		if c := x.f.ready(gvrs[kindGroup], n); c.Status != metav1.ConditionTrue {
			t.Errorf("group %s: %+v", n, c)
		}
	}
	if _, _, ok := fake.group(refused); ok {
		t.Error("the refused group was handed over")
	}
	if c := x.f.ready(gvrs[kindGroup], "b"); c.Reason != ReasonInvalid || !strings.Contains(c.Message, "repo: cannot change") {
		t.Errorf("the refused group: %+v", c)
	}

	x2 := newFixture(t, refusingEngine{&fakeEngine{states: map[string]GroupState{}}, func(i int, g config.GroupConfig) error {
		return &orchestrator.IdentityError{FieldError: config.FieldError{Field: "forges[0].type", Msg: "cannot change", List: "forges"}}
	}}, SecretAccess{Names: []string{"gh"}})
	x2.add(forgeAndSecret + "---\n" + runwayGroupYAML("a", "acme/a"))
	x2.sync(kindForge, "github")
	x2.sync(kindGroup, "a")
	if err := x2.sync(kindGroup, "a"); err == nil || !strings.Contains(err.Error(), "the engine refused the set") {
		t.Errorf("a forge refused: %v, want the hand-over failed", err)
	}
	if c := x2.f.ready(gvrs[kindGroup], "a"); c.Reason == ReasonInvalid {
		t.Errorf("a forge's refusal marked the group: %+v", c)
	}
}

// A group the engine's rules refuse is refused on the object before it
// is handed over, every field at fault named as the object's user reads
// it: within the group, not at the engine's list index.
func TestValidateNamesFieldsWithinTheGroup(t *testing.T) {
	fc := config.ForgeConfig{Name: "f", Type: "github", URL: "https://api.github.com", Secrets: &secretSource{}}
	gc := config.GroupConfig{Name: "g", Forge: "f", Scope: "user", User: "u", MaxActiveRunners: 1, Stemcell: config.StemcellConfig{CID: "s"},
		Runner: config.RunnerConfig{Command: "/r"}}
	err := validate(&fc, &gc)
	want := "Invalid: group scope: user is not supported on GitHub (use org or repo); " +
		"group labels: at least one label is required (no default labels are added)"
	if err == nil || err.Error() != want {
		t.Errorf("validate: %v\nwant %s", err, want)
	}
}
