package controller

import (
	"context"
	"fmt"
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
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/runway-cpi/runway/src/logging"
)

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
	ctl := New(opt)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { ctl.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return ctl
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
	u, err := f.dyn.Resource(gvr).Namespace(f.ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return metav1.Condition{}
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, cd := range conds {
		m := cd.(map[string]any)
		if m["type"] == "Ready" {
			return metav1.Condition{Type: "Ready", Status: metav1.ConditionStatus(fmt.Sprint(m["status"])), Reason: fmt.Sprint(m["reason"]),
				Message: fmt.Sprint(m["message"])}
		}
	}
	return metav1.Condition{}
}
