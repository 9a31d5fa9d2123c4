package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	giteav1 "github.com/runway-cpi/runway/src/controller/apis/gitea/v1alpha1"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/testkit/kubeyaml"
)

// Seed 001's example, applied unedited, becomes one engine group of its
// own Gitea forge: its scope, labels and maxActiveRunners, the seed's
// runner image, its token read from its Secret (a rotation reaches the
// engine without another hand-over); its status carries the engine's
// counts, lastCheckTime and observedGeneration; an edit of
// maxActiveRunners is handed over; a refused token and a missing Secret
// are the Ready condition's reasons; a runner event becomes an Event on
// it; deleting it retires the group and the finalizer holds it until the
// engine says nothing is left.
func TestSeedRunnerGroupThroughTheController(t *testing.T) {
	c := newCluster(t)
	eng := &fakeEngine{states: map[string]GroupState{}}
	ctl := c.start(t, eng)
	for _, u := range kubeyaml.Read(t, "testdata/seed-001-runnergroup.yaml") {
		if err := c.create(u); err != nil {
			t.Fatal(err)
		}
	}
	name := engineName(kindSeed, c.ns, "acme-linux")
	g := eng.handedOver(t, name, "the seed's group handed to the engine")
	if g.Scope != "org" || g.Org != "acme" || g.MaxActiveRunners != 2 || strings.Join(g.Labels, ",") != "linux" ||
		g.Stemcell.CloudProperties["image"] != "registry.example/act_runner:1" || g.Runner.Command != "/bin/runner" {
		t.Errorf("group %+v", g.GroupConfig)
	}
	if g.forge.Type != "gitea" || g.forge.URL != "http://gitea.runway.test:3000" || g.forge.Secrets.Token() != "seed-api-token-0123456789abcdef" {
		t.Errorf("forge %+v, token %q", g.forge, g.forge.Secrets.Token())
	}

	eng.set(name, GroupState{ActiveRunners: 1, QueuedJobs: 3, LastCheckTime: time.Now()})
	waitFor(t, 10*time.Second, "status with the engine's counts and Ready", func() bool {
		cond, u := c.readyOf(t, giteav1.Resource, "acme-linux")
		active, _, _ := unstructured.NestedInt64(u.Object, "status", "activeRunners")
		last, _, _ := unstructured.NestedString(u.Object, "status", "lastCheckTime")
		gen, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
		return cond.Status == metav1.ConditionTrue && active == 1 && last != "" && gen == u.GetGeneration()
	})

	patch := func(p string) {
		t.Helper()
		if _, err := c.dyn.Resource(giteav1.Resource).Namespace(c.ns).Patch(context.Background(), "acme-linux", mergePatch, []byte(p), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	patch(`{"spec":{"maxActiveRunners":5}}`)
	waitFor(t, 10*time.Second, "maxActiveRunners 5 handed over", func() bool {
		g, _, _ := eng.group(name)
		return g.MaxActiveRunners == 5
	})
	secret := func(name, value string) {
		t.Helper()
		p := fmt.Sprintf(`{"stringData":{"token":%q}}`, value)
		if _, err := c.kube.CoreV1().Secrets(c.ns).Patch(context.Background(), name, mergePatch, []byte(p), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	secret("gitea-auth-token", "rotated-token-fedcba9876543210")
	waitFor(t, 10*time.Second, "the rotated token in use", func() bool { return g.forge.Secrets.Token() == "rotated-token-fedcba9876543210" })

	eng.mu.Lock()
	eng.checkErr = fmt.Errorf("%w: registration token: the token lacks the scope write:organization", ErrTokenScope)
	eng.mu.Unlock()
	secret("gitea-auth-token", "another-token-0000000000")
	waitFor(t, 10*time.Second, "Ready false: TokenScopeMissing", func() bool {
		cond, _ := c.readyOf(t, giteav1.Resource, "acme-linux")
		return cond.Reason == ReasonTokenScopeMissing && strings.Contains(cond.Message, "write:organization")
	})
	eng.mu.Lock()
	eng.checkErr = nil
	eng.mu.Unlock()
	if err := c.kube.CoreV1().Secrets(c.ns).Delete(context.Background(), "gitea-registration-token", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "Ready false: SecretMissing naming the field", func() bool {
		cond, _ := c.readyOf(t, giteav1.Resource, "acme-linux")
		return cond.Reason == ReasonSecretMissing && strings.Contains(cond.Message, "spec.registrationToken")
	})
	for _, tok := range []string{"another-token-0000000000", "rotated-token-fedcba9876543210"} {
		if cond, _ := c.readyOf(t, giteav1.Resource, "acme-linux"); strings.Contains(cond.Message, tok) {
			t.Errorf("a token in the condition: %q", cond.Message)
		}
	}

	ctl.RunnerEvent(name, name+"-0123456789", "created", "VM vm-1 made for job 7")
	waitFor(t, 10*time.Second, "a RunnerCreated event on the group", func() bool {
		evs, _ := c.kube.CoreV1().Events(c.ns).List(context.Background(), metav1.ListOptions{})
		for _, ev := range evs.Items {
			if ev.Reason == "RunnerCreated" && ev.InvolvedObject.Name == "acme-linux" && ev.InvolvedObject.Kind == "RunnerGroup" {
				return true
			}
		}
		return false
	})

	// Deleted: the group is retired, with the config it had (its Secret
	// is gone now), and the object stays until the engine is done.
	if err := c.dyn.Resource(giteav1.Resource).Namespace(c.ns).Delete(context.Background(), "acme-linux", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the group retiring", func() bool {
		g, _, _ := eng.group(name)
		return g.Retire
	})
	// The status follows the hand-over: awaited, and the object must
	// still be there with it.
	waitFor(t, 10*time.Second, "Ready false: Deleting, the object kept while the engine retires it", func() bool {
		cond, u := c.readyOf(t, giteav1.Resource, "acme-linux")
		return u != nil && cond.Reason == ReasonDeleting
	})
	eng.set(name, GroupState{Retired: true})
	waitFor(t, 10*time.Second, "the object gone and the group left out", func() bool {
		_, u := c.readyOf(t, giteav1.Resource, "acme-linux")
		_, _, handed := eng.group(name)
		return u == nil && !handed
	})
}

// handed is a group with its forge, as the engine got them.
type handed struct {
	config.GroupConfig
	forge config.ForgeConfig
}

// Runway's own resources: a RunnerGroup waits (ForgeMissing) until its
// Forge exists, then becomes a group of that forge with everything its
// spec says (defaults from the API server included); the Forge's webhook
// secret reaches the engine; the API server itself refuses invalid
// objects, naming the field.
func TestRunwayResourcesThroughTheController(t *testing.T) {
	c := newCluster(t)
	eng := &fakeEngine{states: map[string]GroupState{}}
	c.start(t, eng)
	objs := kubeyaml.Parse(t, []byte(`
apiVersion: runway.io/v1alpha1
kind: RunnerGroup
metadata: {name: arm}
spec:
  forge: github
  scope: repo
  repo: acme/app
  labels: [self-hosted, arm64]
  maxActiveRunners: 3
  minIdle: 1
  priority: 7
  image: registry.example/runner:2
  cloudProperties: {cpu: 2, ram: 2048}
  runner: {command: /bin/runner, args: [--once], env: {A: b}}
  timeouts: {idle: 5m}
---
apiVersion: v1
kind: Secret
metadata: {name: gh}
stringData: {token: ghp-token-0123456789, hook: hook-secret-0123456789}
`))
	for _, u := range objs {
		if err := c.create(u); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "Ready false: ForgeMissing", func() bool {
		cond, _ := c.readyOf(t, gvrs[kindGroup], "arm")
		return cond.Reason == ReasonForgeMissing && strings.Contains(cond.Message, "spec.forge")
	})
	forgeObj := kubeyaml.Parse(t, []byte(`
apiVersion: runway.io/v1alpha1
kind: Forge
metadata: {name: github}
spec:
  type: github
  token: {name: gh, key: token}
  webhookSecret: {name: gh, key: hook}
`))[0]
	if err := c.create(forgeObj); err != nil {
		t.Fatal(err)
	}
	name := engineName(kindGroup, c.ns, "arm")
	g := eng.handedOver(t, name, "the group handed over with its forge")
	if g.Scope != "repo" || g.Repo != "acme/app" || g.MaxActiveRunners != 3 || g.MinIdle != 1 || g.Priority != 7 ||
		g.SpawnConcurrency != 4 || g.Timeouts.Idle.Duration != 5*time.Minute || g.Timeouts.Spawn.Duration != 10*time.Minute ||
		g.CloudProperties["ram"] != float64(2048) || g.Runner.Env["A"] != "b" || g.Stemcell.CloudProperties["image"] != "registry.example/runner:2" {
		t.Errorf("group %+v", g.GroupConfig)
	}
	if g.forge.Type != "github" || g.forge.URL != "https://api.github.com" || g.forge.Secrets.WebhookSecret() != "hook-secret-0123456789" {
		t.Errorf("forge %+v", g.forge)
	}
	waitFor(t, 10*time.Second, "both Ready", func() bool {
		fc, _ := c.readyOf(t, gvrs[kindForge], "github")
		gc, _ := c.readyOf(t, gvrs[kindGroup], "arm")
		return fc.Status == metav1.ConditionTrue && gc.Status == metav1.ConditionTrue
	})

	for _, bad := range []struct{ yaml, field string }{
		{`{apiVersion: runway.io/v1alpha1, kind: RunnerGroup, metadata: {name: b1}, spec: {forge: github, scope: org, labels: [x], maxActiveRunners: 1, image: i, runner: {command: /r}}}`, "spec.org"},
		{`{apiVersion: runway.io/v1alpha1, kind: RunnerGroup, metadata: {name: b2}, spec: {forge: github, scope: org, org: a, labels: [x], maxActiveRunners: 1, minIdle: 2, image: i, runner: {command: /r}}}`, "spec.minIdle"},
		{`{apiVersion: runway.io/v1alpha1, kind: RunnerGroup, metadata: {name: b3}, spec: {forge: github, scope: org, org: a, labels: [], maxActiveRunners: 1, image: i, runner: {command: /r}}}`, "spec.labels"},
		{`{apiVersion: runway.io/v1alpha1, kind: Forge, metadata: {name: b4}, spec: {type: forgejo, url: "http://f", token: {name: t, key: k}, webhookSecret: {name: t, key: h}}}`, "spec.webhookSecret"},
		{`{apiVersion: runway.io/v1alpha1, kind: Forge, metadata: {name: b5}, spec: {type: gitlab, url: "http://f", token: {name: t, key: k}}}`, "spec.type"},
		{`{apiVersion: gitea.bpg.pw/v1alpha1, kind: RunnerGroup, metadata: {name: b6}, spec: {scope: user, giteaURL: "https://g", maxActiveRunners: 1, registrationToken: {name: s, key: k}, authToken: {name: s, key: k}}}`, "spec.user"},
		{`{apiVersion: gitea.bpg.pw/v1alpha1, kind: RunnerGroup, metadata: {name: b7}, spec: {scope: org, org: a, maxActiveRunners: 1, registrationToken: {name: s, key: k}, authToken: {name: s, key: k}}}`, "spec.gitea"},
		{`{apiVersion: runway.io/v1alpha1, kind: RunnerGroup, metadata: {name: b9}, spec: {forge: github, scope: org, org: a, labels: [x], maxActiveRunners: 1, image: i, runner: {command: /r}, scaleSet: {name: s}}}`, "spec.scaleSet"},
		{`{apiVersion: runway.io/v1alpha1, kind: RunnerGroup, metadata: {name: b10}, spec: {forge: github, scope: org, org: a, labels: [x], maxActiveRunners: 1, image: i, runner: {command: /r}, demand: webhooks}}`, "spec.demand"},
		{`{apiVersion: gitea.bpg.pw/v1alpha1, kind: RunnerGroup, metadata: {name: b8}, spec: {scope: org, org: a, giteaURL: "https://g", maxActiveRunners: 0, registrationToken: {name: s, key: k}, authToken: {name: s, key: k}}}`, "spec.maxActiveRunners"},
	} {
		err := c.create(kubeyaml.Parse(t, []byte(bad.yaml))[0])
		if err == nil || !strings.Contains(err.Error(), bad.field) {
			t.Errorf("%s: the API server answered %v; want a refusal naming %s", bad.yaml, err, bad.field)
		}
	}
	// What a group's runners were made with cannot change.
	_, err := c.dyn.Resource(gvrs[kindGroup]).Namespace(c.ns).Patch(context.Background(), "arm", mergePatch,
		[]byte(`{"spec":{"repo":"acme/other"}}`), metav1.PatchOptions{})
	if err == nil || !strings.Contains(err.Error(), "cannot change") {
		t.Errorf("changing a group's repo: %v", err)
	}
	_, err = c.dyn.Resource(gvrs[kindGroup]).Namespace(c.ns).Patch(context.Background(), "arm", mergePatch,
		[]byte(`{"spec":{"demand":"scale_set"}}`), metav1.PatchOptions{})
	if err == nil || !strings.Contains(err.Error(), "cannot change") {
		t.Errorf("changing a group's demand: %v", err)
	}
	// A group taking its jobs from a GitHub runner scale set.
	ss := kubeyaml.Parse(t, []byte(`{apiVersion: runway.io/v1alpha1, kind: RunnerGroup, metadata: {name: linux-ss}, spec: {forge: github, scope: org, org: acme, labels: [runway-linux], maxActiveRunners: 2, image: i, runner: {command: /r}, demand: scale_set, scaleSet: {runnerGroupID: 3}}}`))[0]
	if err := c.create(ss); err != nil {
		t.Fatal(err)
	}
	g = eng.handedOver(t, engineName(kindGroup, c.ns, "linux-ss"), "the scale-set group handed over")
	if g.Demand != config.DemandScaleSet || g.ScaleSet.Name != "linux-ss" || g.ScaleSet.RunnerGroupID != 3 {
		t.Errorf("scale-set group: demand %q, scale set %+v", g.Demand, g.ScaleSet)
	}
}

// A GitHub Forge whose credentials are a GitHub App's, in the Secret form
// actions-runner-controller's githubConfigSecret takes: the engine's
// forge answers the App (id, installation, key) at every use, so a key
// rotated in the Secret reaches it; an enterprise's scale-set group is
// handed over with its enterprise, but not on an App's forge (GitHub lets
// no App register enterprise runners). The API server refuses a Forge
// with both a token and githubConfigSecret, or neither.
func TestGitHubAppForgeThroughTheController(t *testing.T) {
	c := newCluster(t)
	eng := &fakeEngine{states: map[string]GroupState{}}
	c.start(t, eng)
	key, rotated := appKeyPEM(t), appKeyPEM(t)
	secret := func(k string) *unstructured.Unstructured {
		return kubeyaml.Parse(t, []byte(fmt.Sprintf("{apiVersion: v1, kind: Secret, metadata: {name: gh-app}, stringData: {github_app_id: \"123\", github_app_installation_id: \"42\", github_app_private_key: %q}}", k)))[0]
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(c.create(secret(key)))
	must(c.create(kubeyaml.Parse(t, []byte(`{apiVersion: runway.io/v1alpha1, kind: Forge, metadata: {name: gh}, spec: {type: github, githubConfigSecret: gh-app}}`))[0]))
	must(c.create(kubeyaml.Parse(t, []byte(`{apiVersion: runway.io/v1alpha1, kind: RunnerGroup, metadata: {name: ss}, spec: {forge: gh, scope: org, org: acme, labels: [x], maxActiveRunners: 1, image: i, runner: {command: /r}, demand: scale_set}}`))[0]))
	g := eng.handedOver(t, engineName(kindGroup, c.ns, "ss"), "the group handed over with the App's forge")
	src, ok := g.forge.Secrets.(config.AppSource)
	if !ok {
		t.Fatal("the forge's source holds no App")
	}
	if id, inst, k := src.App(); id != "123" || inst != 42 || k != strings.TrimSpace(key) || g.forge.Secrets.Token() != "" {
		t.Errorf("the engine's App: %s/%d", id, inst)
	}
	_, err := c.kube.CoreV1().Secrets(c.ns).Update(context.Background(), func() *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "gh-app", Namespace: c.ns},
			StringData: map[string]string{"github_app_id": "123", "github_app_installation_id": "42", "github_app_private_key": rotated}}
		return s
	}(), metav1.UpdateOptions{})
	must(err)
	waitFor(t, 10*time.Second, "the rotated key in use", func() bool { _, _, k := src.App(); return k == strings.TrimSpace(rotated) })
	must(c.create(kubeyaml.Parse(t, []byte(`{apiVersion: runway.io/v1alpha1, kind: RunnerGroup, metadata: {name: ent}, spec: {forge: gh, scope: enterprise, enterprise: acme-corp, labels: [x], maxActiveRunners: 1, image: i, runner: {command: /r}, demand: scale_set}}`))[0]))
	waitFor(t, 10*time.Second, "the enterprise group refused on the App's forge", func() bool {
		cond, _ := c.readyOf(t, gvrs[kindGroup], "ent")
		return cond.Reason == ReasonInvalid && strings.Contains(cond.Message, "classic PAT")
	})
	for _, bad := range []string{
		`{apiVersion: runway.io/v1alpha1, kind: Forge, metadata: {name: b1}, spec: {type: github, token: {name: t, key: k}, githubConfigSecret: gh-app}}`,
		`{apiVersion: runway.io/v1alpha1, kind: Forge, metadata: {name: b2}, spec: {type: github}}`,
		`{apiVersion: runway.io/v1alpha1, kind: Forge, metadata: {name: b3}, spec: {type: gitea, url: "http://g", githubConfigSecret: gh-app}}`,
		`{apiVersion: runway.io/v1alpha1, kind: RunnerGroup, metadata: {name: b4}, spec: {forge: gh, scope: enterprise, labels: [x], maxActiveRunners: 1, image: i, runner: {command: /r}, demand: scale_set}}`,
	} {
		if err := c.create(kubeyaml.Parse(t, []byte(bad))[0]); err == nil {
			t.Errorf("%s: the API server took it", bad)
		}
	}
}
