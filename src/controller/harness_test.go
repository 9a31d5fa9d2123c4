package controller

// The controller's test harness: the dev cluster and client-go's fake
// clients to run it on, and a fake engine to hand its config to.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/kubernetes"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/testkit/kubeyaml"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// fakeEngine records what the controller hands over and reports the
// states a test sets: the controller's tests are about the controller
// (the engine's own are in src/orchestrator; the e2e runs both).
type fakeEngine struct {
	mu       sync.Mutex
	forges   []config.ForgeConfig
	groups   []config.GroupConfig
	states   map[string]GroupState
	checkErr error
	checked  []config.ForgeConfig // every forge Check asked
}

func (f *fakeEngine) Replace(forges []config.ForgeConfig, groups []config.GroupConfig) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.forges, f.groups = forges, groups
	for _, g := range groups {
		if _, ok := f.states[g.Name]; !ok {
			f.states[g.Name] = GroupState{}
		}
	}
	return nil
}

func (f *fakeEngine) State(name string) (GroupState, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.states[name]
	return s, ok
}

func (f *fakeEngine) Check(_ context.Context, fc config.ForgeConfig, _ config.GroupConfig) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checked = append(f.checked, fc)
	return f.checkErr
}

func (f *fakeEngine) set(name string, s GroupState) {
	f.mu.Lock()
	f.states[name] = s
	f.mu.Unlock()
}

// group answers the group handed over under name, with its forge.
func (f *fakeEngine) group(name string) (config.GroupConfig, config.ForgeConfig, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, g := range f.groups {
		if g.Name == name {
			for _, fc := range f.forges {
				if fc.Name == g.Forge {
					return g, fc, true
				}
			}
		}
	}
	return config.GroupConfig{}, config.ForgeConfig{}, false
}

// handedOver waits (10 s) until the group name is handed over, and
// answers it with its forge.
func (f *fakeEngine) handedOver(t *testing.T, name, what string) (g handed) {
	t.Helper()
	waitFor(t, 10*time.Second, what, func() bool {
		var ok bool
		g.GroupConfig, g.forge, ok = f.group(name)
		return ok
	})
	return g
}

// cluster is the dev cluster as the tests use it: clients as
// cluster-admin, the CRDs applied, a namespace of the test's own.
type cluster struct {
	kube kubernetes.Interface
	dyn  dynamic.Interface
	ns   string
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

func newCluster(t *testing.T) *cluster {
	env := testenv.Need(t, "scripts/k8s-dev start, then its $K8S_DEV_DIR/env", "RUNWAY_K8S_ADMIN_KUBECONFIG")
	rc, err := clientcmd.BuildConfigFromFlags("", env[0])
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{kube: kubernetes.NewForConfigOrDie(rc), dyn: dynamic.NewForConfigOrDie(rc)}
	ctx := context.Background()
	files, _ := filepath.Glob("../../config/helm/runway/crds/*.yaml")
	for _, f := range files {
		for _, u := range kubeyaml.Read(t, f) {
			c.applyCluster(t, crdGVR, u)
			waitFor(t, 30*time.Second, "CRD "+u.GetName()+" established", func() bool {
				got, err := c.dyn.Resource(crdGVR).Get(ctx, u.GetName(), metav1.GetOptions{})
				if err != nil {
					return false
				}
				conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
				for _, cd := range conds {
					m := cd.(map[string]any)
					if m["type"] == "Established" && m["status"] == "True" {
						return true
					}
				}
				return false
			})
		}
	}
	b := make([]byte, 4)
	rand.Read(b)
	c.ns = "runway-ctl-" + hex.EncodeToString(b)
	if _, err := c.kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: c.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Objects still holding the finalizer would keep the namespace.
		for _, gvr := range gvrs {
			list, _ := c.dyn.Resource(gvr).Namespace(c.ns).List(ctx, metav1.ListOptions{})
			for _, u := range list.Items {
				c.dyn.Resource(gvr).Namespace(c.ns).Patch(ctx, u.GetName(), mergePatch, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
			}
		}
		c.kube.CoreV1().Namespaces().Delete(ctx, c.ns, metav1.DeleteOptions{})
	})
	return c
}

// applyCluster creates or replaces a cluster-scoped object.
func (c *cluster) applyCluster(t *testing.T, gvr schema.GroupVersionResource, u *unstructured.Unstructured) {
	ctx := context.Background()
	old, err := c.dyn.Resource(gvr).Get(ctx, u.GetName(), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = c.dyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{})
	case err == nil:
		u.SetResourceVersion(old.GetResourceVersion())
		_, err = c.dyn.Resource(gvr).Update(ctx, u, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatalf("applying %s: %v", u.GetName(), err)
	}
}

// create makes an object in the test's namespace; it answers the API
// server's error.
func (c *cluster) create(u *unstructured.Unstructured) error {
	gvr, ok := map[string]schema.GroupVersionResource{"Secret": {Version: "v1", Resource: "secrets"},
		"RunnerGroup.gitea.bpg.pw": gvrs[kindSeed], "RunnerGroup.runway.io": gvrs[kindGroup], "Forge.runway.io": gvrs[kindForge]}[kindKey(u)]
	if !ok {
		return errors.New("unknown kind " + kindKey(u))
	}
	_, err := c.dyn.Resource(gvr).Namespace(c.ns).Create(context.Background(), u, metav1.CreateOptions{})
	return err
}

func kindKey(u *unstructured.Unstructured) string {
	gvk := u.GroupVersionKind()
	if gvk.Group == "" {
		return gvk.Kind
	}
	return gvk.Kind + "." + gvk.Group
}

// waitFor polls cond every 50 ms until it holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("not within %s: %s", d, what)
		}
	}
}

// start runs a controller on the test's namespace with engine e.
func (c *cluster) start(t *testing.T, e Engine) *Controller {
	return runController(t, Options{Kube: c.kube, Dyn: c.dyn, Namespaces: []string{c.ns}, Engine: e, StatusInterval: 200 * time.Millisecond,
		Secrets: SecretAccess{Names: []string{"gitea-auth-token", "gitea-registration-token", "gh", "gh-app"}},
		Seed:    Seed{Image: "registry.example/act_runner:1", Command: "/bin/runner", PollInterval: time.Second},
		Log:     logging.Fields{Logger: logging.Discard()}})
}

// runController runs a controller with opt until the test ends.
func runController(t *testing.T, opt Options) *Controller {
	ctl := New(opt)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { ctl.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return ctl
}

// readyOf answers an object's Ready condition.
func (c *cluster) readyOf(t *testing.T, gvr schema.GroupVersionResource, name string) (metav1.Condition, *unstructured.Unstructured) {
	return readyIn(c.dyn, c.ns, gvr, name)
}

// readyIn answers the Ready condition of the object name of namespace ns
// (none when it has none), and the object (nil when there is none).
func readyIn(dyn dynamic.Interface, ns string, gvr schema.GroupVersionResource, name string) (metav1.Condition, *unstructured.Unstructured) {
	u, err := dyn.Resource(gvr).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return metav1.Condition{}, nil
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, cd := range conds {
		m := cd.(map[string]any)
		if m["type"] == "Ready" {
			return metav1.Condition{Type: "Ready", Status: metav1.ConditionStatus(fmt.Sprint(m["status"])), Reason: fmt.Sprint(m["reason"]),
				Message: fmt.Sprint(m["message"])}, u
		}
	}
	return metav1.Condition{}, u
}

// fakeCluster is client-go's fake clients, with the Secrets held to the
// chart's Role as the API server's RBAC would hold them (resourceNames:
// a get by name, a list or watch whose field selector names it; with
// secrets.byLabel, any list and watch), and every Secret request
// recorded: the controller's tests that need no real API server.
type fakeCluster struct {
	kube   *kubefake.Clientset
	dyn    *dynamicfake.FakeDynamicClient
	ns     string
	access SecretAccess

	mu       sync.Mutex
	requests []string // verb name-or-selector, of every Secret request
}

func newFakeCluster(t *testing.T, access SecretAccess, objs ...runtime.Object) *fakeCluster {
	f := &fakeCluster{kube: kubefake.NewClientset(objs...), ns: "team-a", access: access}
	f.dyn = dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		gvrs[kindSeed]: "RunnerGroupList", gvrs[kindForge]: "ForgeList", gvrs[kindGroup]: "RunnerGroupList"})
	f.kube.PrependReactor("*", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return f.authorize(a.GetVerb(), a)
	})
	f.kube.PrependWatchReactor("secrets", func(a k8stesting.Action) (bool, watch.Interface, error) {
		handled, _, err := f.authorize("watch", a)
		return handled, nil, err
	})
	return f
}

// authorize records a Secret request and refuses what the Role does not
// allow.
func (f *fakeCluster) authorize(verb string, a k8stesting.Action) (bool, runtime.Object, error) {
	what := ""
	switch a := a.(type) {
	case k8stesting.GetAction:
		what = a.GetName()
	case k8stesting.ListAction:
		what = a.GetListRestrictions().Fields.String() + "|" + a.GetListRestrictions().Labels.String()
	case k8stesting.WatchAction:
		what = a.GetWatchRestrictions().Fields.String() + "|" + a.GetWatchRestrictions().Labels.String()
	}
	f.mu.Lock()
	f.requests = append(f.requests, verb+" "+what)
	f.mu.Unlock()
	allowed := verb == "create" || verb == "delete"
	switch verb {
	case "get":
		allowed = slices.Contains(f.access.Names, what) || f.access.ByLabel
	case "list", "watch":
		name, ok := strings.CutPrefix(strings.Split(what, "|")[0], "metadata.name=")
		allowed = (ok && slices.Contains(f.access.Names, name)) || f.access.ByLabel
	}
	if !allowed {
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, what, fmt.Errorf("the Role does not allow %s", verb))
	}
	return false, nil, nil
}

// secretRequests are the Secret requests made so far.
func (f *fakeCluster) secretRequests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.requests)
}

func (f *fakeCluster) start(t *testing.T, e Engine) *Controller {
	return f.startSeed(t, e, nil)
}

// startSeed starts a controller whose seed groups get defaults.
func (f *fakeCluster) startSeed(t *testing.T, e Engine, defaults []string) *Controller {
	return f.startWith(t, e, func(o *Options) { o.Seed.DefaultLabels = defaults })
}

// startWith starts a controller with the options edit makes.
func (f *fakeCluster) startWith(t *testing.T, e Engine, edit func(*Options)) *Controller {
	opt := Options{Kube: f.kube, Dyn: f.dyn, Namespaces: []string{f.ns}, Secrets: f.access, Engine: e,
		StatusInterval: 100 * time.Millisecond, Seed: Seed{Image: "registry.example/act_runner:1", Command: "/bin/runner"},
		Log: logging.Fields{Logger: logging.Discard()}}
	edit(&opt)
	return runController(t, opt)
}

// create makes an object of the fake's namespace.
func (f *fakeCluster) create(t *testing.T, u *unstructured.Unstructured) {
	t.Helper()
	ctx := context.Background()
	if u.GetKind() == "Secret" {
		var s corev1.Secret
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &s); err != nil {
			t.Fatal(err)
		}
		s.Namespace = f.ns
		if s.Data == nil {
			s.Data = map[string][]byte{}
		}
		for k, v := range s.StringData {
			s.Data[k] = []byte(v)
		}
		s.StringData = nil
		// Made by the namespace's owner, not through the controller's Role.
		if err := f.kube.Tracker().Add(&s); err != nil {
			t.Fatal(err)
		}
		return
	}
	gvr := map[string]schema.GroupVersionResource{"RunnerGroup.gitea.bpg.pw": gvrs[kindSeed], "RunnerGroup.runway.io": gvrs[kindGroup],
		"Forge.runway.io": gvrs[kindForge]}[kindKey(u)]
	u.SetNamespace(f.ns)
	if _, err := f.dyn.Resource(gvr).Namespace(f.ns).Create(ctx, u, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// ready answers an object's Ready condition.
func (f *fakeCluster) ready(gvr schema.GroupVersionResource, name string) metav1.Condition {
	c, _ := readyIn(f.dyn, f.ns, gvr, name)
	return c
}
