// Package controller is Runway's Kubernetes face: a config source for
// the one engine, not a second engine. It watches seed 001's RunnerGroup
// (gitea.bpg.pw) and Runway's own Forge and RunnerGroup (runway.io) and
// the Secrets they name, through informers and a work queue reconciling
// one object at a time (client-go's sample-controller pattern), turns
// them into the orchestrator's forges and groups, and hands the engine
// the whole set through one call (Engine.Replace). It writes each
// object's status (the seed's activeRunners and lastCheckTime, with
// observedGeneration and a Ready condition saying why not), records the
// engine's runner events on the object, and holds a finalizer until the
// engine has removed the group's runners and registrations.
package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	giteav1 "github.com/runway-cpi/runway/src/controller/apis/gitea/v1alpha1"
	runwayv1 "github.com/runway-cpi/runway/src/controller/apis/runway/v1alpha1"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// Engine is what the controller needs of the orchestrator (cmd/runway
// adapts *orchestrator.Orchestrator to it).
type Engine interface {
	// Replace hands the engine its whole set of forges and groups.
	Replace(forges []config.ForgeConfig, groups []config.GroupConfig) error
	// State is a group's state in the engine (false: no such group).
	State(group string) (GroupState, bool)
	// Check asks the forge for everything the group will use (runway
	// check); an error wrapping ErrTokenScope means the forge refused
	// the token, any other that it could not be asked.
	Check(ctx context.Context, f config.ForgeConfig, g config.GroupConfig) error
}

// GroupState is a group as the engine reports it.
type GroupState struct {
	ActiveRunners, QueuedJobs, Idle, Busy int
	LastCheckTime                         time.Time
	LastError                             string
	Retired                               bool
}

// ErrTokenScope is wrapped by Check's errors when the forge refused the
// token (a missing scope, a revoked token).
var ErrTokenScope = errors.New("the forge refuses the token")

// Finalizer holds a group until its runners, pods and registrations are
// gone.
const Finalizer = "runway.io/runners"

// Options configure the controller.
type Options struct {
	Kube kubernetes.Interface
	Dyn  dynamic.Interface
	// Namespace watched ("": every namespace).
	Namespace string
	Engine    Engine
	Seed      Seed
	Log       logging.Fields
	// Redactor learns every secret value read.
	Redactor *logging.Redactor
	// StatusInterval paces status refreshes from the engine (default 2s).
	StatusInterval time.Duration
	// Workers reconciling at once (default 2).
	Workers int
}

// Controller is the reconcile loop.
type Controller struct {
	opt      Options
	queue    workqueue.TypedRateLimitingInterface[string]
	infs     map[string]cache.SharedIndexInformer // by kind
	secrets  cache.SharedIndexInformer
	recorder record.EventRecorder
	bcast    record.EventBroadcaster

	mu      sync.Mutex
	entries map[string]*entry        // by key: kind/namespace/name
	sources map[string]*secretSource // by engine forge name
	byGroup map[string]string        // engine group name → key

	applyMu sync.Mutex // one Replace at a time
	last    setOf      // the last set the engine took
}

// entry is what one object became.
type entry struct {
	kind, ns, name string
	generation     int64
	uid            string
	deleting       bool
	forge          *config.ForgeConfig // Forge, or a seed group's own
	group          *config.GroupConfig // nil: not handed to the engine
	forgeRef       string              // Runway RunnerGroup: its Forge's key
	secrets        []string            // namespace/name of the Secrets it reads
	bad            *notReady           // why it is not handed over, or not ready
	checkKey       string              // what the last check was for
	checkErr       error
	written        string // the status last written (fingerprint)
	writtenAt      time.Time
}

var gvrs = map[string]schema.GroupVersionResource{
	kindSeed: giteav1.Resource, kindForge: runwayv1.ForgeResource, kindGroup: runwayv1.RunnerGroupResource,
}

// New builds the controller's informers.
func New(opt Options) *Controller {
	if opt.StatusInterval == 0 {
		opt.StatusInterval = 2 * time.Second
	}
	if opt.Workers == 0 {
		opt.Workers = 2
	}
	if opt.Redactor == nil {
		opt.Redactor = &logging.Redactor{}
	}
	c := &Controller{opt: opt, infs: map[string]cache.SharedIndexInformer{}, entries: map[string]*entry{},
		sources: map[string]*secretSource{}, byGroup: map[string]string{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "runway"})}
	df := dynamicinformer.NewFilteredDynamicSharedInformerFactory(opt.Dyn, 10*time.Minute, opt.Namespace, nil)
	for kind, gvr := range gvrs {
		inf := df.ForResource(gvr).Informer()
		inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.enqueueObj(kind, o) },
			UpdateFunc: func(_, o any) { c.enqueueObj(kind, o) },
			DeleteFunc: func(o any) { c.enqueueObj(kind, o) },
		})
		c.infs[kind] = inf
	}
	sf := informers.NewSharedInformerFactoryWithOptions(opt.Kube, 10*time.Minute, informers.WithNamespace(opt.Namespace))
	c.secrets = sf.Core().V1().Secrets().Informer()
	c.secrets.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.secretChanged,
		UpdateFunc: func(_, o any) { c.secretChanged(o) },
		DeleteFunc: c.secretChanged,
	})
	sch := runtime.NewScheme()
	_ = scheme.AddToScheme(sch)
	_ = giteav1.AddToScheme(sch)
	_ = runwayv1.AddToScheme(sch)
	c.bcast = record.NewBroadcaster()
	c.recorder = c.bcast.NewRecorder(sch, corev1.EventSource{Component: "runway"})
	return c
}

// Run reconciles until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.opt.Kube.CoreV1().Events(c.opt.Namespace)})
	defer c.bcast.Shutdown()
	defer c.queue.ShutDown()
	synced := []cache.InformerSynced{c.secrets.HasSynced}
	go c.secrets.Run(ctx.Done())
	for _, inf := range c.infs {
		go inf.Run(ctx.Done())
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return errors.New("controller: informers did not sync")
	}
	c.opt.Log.Info("controller synced", "namespace", c.opt.Namespace)
	var wg sync.WaitGroup
	for range c.opt.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for c.next(ctx) {
			}
		}()
	}
	t := time.NewTicker(c.opt.StatusInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			c.queue.ShutDown()
			wg.Wait()
			return nil
		case <-t.C:
			// The engine's counts move without an object changing.
			c.mu.Lock()
			for key, e := range c.entries {
				if e.kind != kindForge {
					c.queue.Add(key)
				}
			}
			c.mu.Unlock()
		}
	}
}

func (c *Controller) next(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if err := c.reconcile(ctx, key); err != nil {
		c.opt.Log.Warn("reconcile failed; retrying", "object", key, "err", c.opt.Redactor.Redact(err.Error()))
		c.queue.AddRateLimited(key)
		return true
	}
	c.queue.Forget(key)
	return true
}

func (c *Controller) enqueueObj(kind string, o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return
	}
	c.queue.Add(kind + "/" + u.GetNamespace() + "/" + u.GetName())
	if kind == kindForge {
		// Its groups read it.
		c.mu.Lock()
		fkey := kind + "/" + u.GetNamespace() + "/" + u.GetName()
		for key, e := range c.entries {
			if e.forgeRef == fkey {
				c.queue.Add(key)
			}
		}
		c.mu.Unlock()
	}
}

// secretChanged requeues every object that reads the Secret.
func (c *Controller) secretChanged(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	s, ok := o.(*corev1.Secret)
	if !ok {
		return
	}
	ref := s.Namespace + "/" + s.Name
	c.mu.Lock()
	defer c.mu.Unlock()
	for key, e := range c.entries {
		for _, r := range e.secrets {
			if r == ref {
				c.queue.Add(key)
				if e.kind == kindForge {
					for k2, e2 := range c.entries {
						if e2.forgeRef == key {
							c.queue.Add(k2)
						}
					}
				}
			}
		}
	}
}

// readSecret reads a Secret's key from the informer's cache and teaches
// the redactor its value.
func (c *Controller) readSecret(ns, name, key string) (string, bool) {
	o, ok, err := c.secrets.GetStore().GetByKey(ns + "/" + name)
	if err != nil || !ok {
		return "", false
	}
	b, ok := o.(*corev1.Secret).Data[key]
	if ok {
		c.opt.Redactor.Add(string(b))
	}
	return string(b), ok
}

// RunnerEvent records an engine's runner event on the group's object.
func (c *Controller) RunnerEvent(group, runner, typ, msg string) {
	c.mu.Lock()
	key, ok := c.byGroup[group]
	e := c.entries[key]
	c.mu.Unlock()
	if !ok || e == nil {
		return
	}
	obj := c.ref(e)
	if obj == nil {
		return
	}
	switch typ {
	case "created":
		c.recorder.Eventf(obj, corev1.EventTypeNormal, "RunnerCreated", "runner %s: %s", runner, msg)
	case "deleted":
		c.recorder.Eventf(obj, corev1.EventTypeNormal, "RunnerDeleted", "runner %s: %s", runner, msg)
	default:
		c.recorder.Eventf(obj, corev1.EventTypeWarning, "RunnerFailed", "runner %s: %s", runner, c.opt.Redactor.Redact(msg))
	}
}

// ref is the entry's object, for events.
func (c *Controller) ref(e *entry) runtime.Object {
	gv, kind := runwayv1.SchemeGroupVersion, "RunnerGroup"
	switch e.kind {
	case kindSeed:
		gv = giteav1.SchemeGroupVersion
	case kindForge:
		kind = "Forge"
	}
	return &corev1.ObjectReference{APIVersion: gv.String(), Kind: kind, Namespace: e.ns, Name: e.name, UID: types.UID(e.uid)}
}

func keyOf(kind, ns, name string) string { return fmt.Sprintf("%s/%s/%s", kind, ns, name) }
