// Package controller is Runway's Kubernetes face: a config source for
// the one engine, not a second engine. It watches seed 001's RunnerGroup
// (gitea.bpg.pw) and Runway's own Forge and RunnerGroup (runway.io) and
// the Secrets they name (only those the operator marked for Runway),
// through informers and a work queue reconciling
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
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
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

// Engine is what the controller needs of the orchestrator (NewEngine
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
	// NotTakingJobs: runners registered that take none of the group's
	// queued jobs; SpawnsHeldUntil: the group makes none until then.
	NotTakingJobs   int
	SpawnsHeldUntil time.Time
}

// ErrTokenScope is wrapped by Check's errors when the forge refused the
// token (a missing scope, a revoked token).
var ErrTokenScope = errors.New("the forge refuses the token")

// Finalizer holds a group until its runners, pods and registrations are
// gone.
const Finalizer = "runway.io/runners"

// SecretLabel marks a Secret of a watched namespace as Runway's to read
// (with SecretAccess.ByLabel): SecretLabel=true.
const SecretLabel = "runway.io/secret"

// SecretAccess is which Secrets of a watched namespace the controller
// reads: those named (the chart's secrets.names, which its Role names
// too) and, with ByLabel, those labelled SecretLabel=true. A resource
// naming any other is refused on its status and the Secret is not read:
// whoever may write a RunnerGroup must not make Runway send another
// Secret of the namespace (the store's DSN, another team's token) to a
// URL of their choosing.
type SecretAccess struct {
	Names   []string
	ByLabel bool
}

// allows says whether name may be read by name.
func (a SecretAccess) allows(name string) bool { return slices.Contains(a.Names, name) }

// rule says which Secrets may be read, for a refusal's message.
func (a SecretAccess) rule() string {
	named := "none is named in the chart's secrets.names"
	if len(a.Names) > 0 {
		named = "those named in the chart's secrets.names (" + strings.Join(a.Names, ", ") + ")"
	}
	if a.ByLabel {
		return named + ", and those labelled " + SecretLabel + "=true"
	}
	return named + " (secrets.byLabel is off)"
}

// Options configure the controller.
type Options struct {
	Kube kubernetes.Interface
	Dyn  dynamic.Interface
	// Namespaces watched (none: every namespace).
	Namespaces []string
	// Secrets it may read.
	Secrets SecretAccess
	// Addresses the resources' forge URLs may reach (nil: any).
	Addresses *AddressPolicy
	Engine    Engine
	Seed      Seed
	Log       logging.Fields
	// Redactor learns every secret value read.
	Redactor *logging.Redactor
	// StatusInterval paces status refreshes from the engine (default 2s).
	StatusInterval time.Duration
	// Workers reconciling at once (default 2).
	Workers int
	// Fence, when set, says whether this process may still act (it
	// holds the Lease as of a recent renewal): meanwhile nothing is
	// reconciled and no status written.
	Fence func() error
}

// Controller is the reconcile loop.
type Controller struct {
	opt   Options
	queue workqueue.TypedRateLimitingInterface[string]
	infs  map[string]map[string]cache.SharedIndexInformer // by kind, then namespace ("": all)
	// secrets: the readable Secrets' informers, by namespace and name
	// (one each: its list and watch name it, as the Role does), and by
	// namespace and "" for the labelled ones.
	secrets  map[[2]string]cache.SharedIndexInformer
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
	c := &Controller{opt: opt, infs: map[string]map[string]cache.SharedIndexInformer{}, entries: map[string]*entry{},
		sources: map[string]*secretSource{}, byGroup: map[string]string{}, secrets: map[[2]string]cache.SharedIndexInformer{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "runway"})}
	namespaces := opt.Namespaces
	if len(namespaces) == 0 {
		namespaces = []string{metav1.NamespaceAll}
	}
	for _, ns := range namespaces {
		df := dynamicinformer.NewFilteredDynamicSharedInformerFactory(opt.Dyn, 10*time.Minute, ns, nil)
		for kind, gvr := range gvrs {
			inf := df.ForResource(gvr).Informer()
			inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
				AddFunc:    func(o any) { c.enqueueObj(kind, o) },
				UpdateFunc: func(_, o any) { c.enqueueObj(kind, o) },
				DeleteFunc: func(o any) { c.enqueueObj(kind, o) },
			})
			if c.infs[kind] == nil {
				c.infs[kind] = map[string]cache.SharedIndexInformer{}
			}
			c.infs[kind][ns] = inf
		}
		// Only the Secrets it may read are ever listed or watched.
		for _, name := range opt.Secrets.Names {
			c.secrets[[2]string{ns, name}] = c.secretInformer(ns, func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
			})
		}
		if opt.Secrets.ByLabel {
			c.secrets[[2]string{ns, ""}] = c.secretInformer(ns, func(o *metav1.ListOptions) {
				o.LabelSelector = SecretLabel + "=true"
			})
		}
	}
	sch := runtime.NewScheme()
	_ = scheme.AddToScheme(sch)
	_ = giteav1.AddToScheme(sch)
	_ = runwayv1.AddToScheme(sch)
	c.bcast = record.NewBroadcaster()
	c.recorder = c.bcast.NewRecorder(sch, corev1.EventSource{Component: "runway"})
	return c
}

// secretInformer watches the Secrets of ns that tweak selects.
func (c *Controller) secretInformer(ns string, tweak func(*metav1.ListOptions)) cache.SharedIndexInformer {
	inf := informers.NewSharedInformerFactoryWithOptions(c.opt.Kube, 10*time.Minute, informers.WithNamespace(ns),
		informers.WithTweakListOptions(tweak)).Core().V1().Secrets().Informer()
	inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    c.secretChanged,
		UpdateFunc: func(_, o any) { c.secretChanged(o) },
		DeleteFunc: c.secretChanged,
	})
	return inf
}

// Run reconciles until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.bcast.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.opt.Kube.CoreV1().Events(metav1.NamespaceAll)})
	defer c.bcast.Shutdown()
	defer c.queue.ShutDown()
	var synced []cache.InformerSynced
	for _, inf := range c.secrets {
		go inf.Run(ctx.Done())
		synced = append(synced, inf.HasSynced)
	}
	for _, byNS := range c.infs {
		for _, inf := range byNS {
			go inf.Run(ctx.Done())
			synced = append(synced, inf.HasSynced)
		}
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return errors.New("controller: informers did not sync")
	}
	c.opt.Log.Info("controller synced", "namespaces", strings.Join(c.opt.Namespaces, ","), "secrets", c.opt.Secrets.rule())
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
	if c.opt.Fence != nil && c.opt.Fence() != nil {
		c.queue.AddAfter(key, time.Second) // the Lease renewed, or the process ends
		return true
	}
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

// readSecret answers a key of a Secret of ns for a resource's field, if
// the Secret is one the controller may read (else it is not looked at:
// refused, naming the field and the rule), and teaches the redactor its
// value.
func (c *Controller) readSecret(ns, field, name, key string) (string, error) {
	var sec *corev1.Secret
	inf := c.secrets[[2]string{ns, name}]
	if inf == nil {
		inf = c.secrets[[2]string{metav1.NamespaceAll, name}]
	}
	labelled := c.secrets[[2]string{ns, ""}]
	if labelled == nil {
		labelled = c.secrets[[2]string{metav1.NamespaceAll, ""}]
	}
	switch {
	case c.opt.Secrets.allows(name) && inf != nil:
		if o, ok, _ := inf.GetStore().GetByKey(ns + "/" + name); ok {
			sec = o.(*corev1.Secret)
		}
	case labelled != nil:
		if o, ok, _ := labelled.GetStore().GetByKey(ns + "/" + name); ok && o.(*corev1.Secret).Labels[SecretLabel] == "true" {
			sec = o.(*corev1.Secret)
		}
		if sec == nil {
			return "", &notReady{ReasonSecretNotAllowed, fmt.Sprintf("%s: no Secret %s/%s labelled %s=true: Runway reads only %s (one not marked is not read)",
				field, ns, name, SecretLabel, c.opt.Secrets.rule())}
		}
	default:
		return "", &notReady{ReasonSecretNotAllowed, fmt.Sprintf("%s: Runway may not read Secret %s/%s and did not: it reads only %s",
			field, ns, name, c.opt.Secrets.rule())}
	}
	var v []byte
	ok := false
	if sec != nil {
		v, ok = sec.Data[key]
	}
	if !ok {
		return "", &notReady{ReasonSecretMissing, fmt.Sprintf("%s: Secret %s/%s has no key %q (or does not exist)", field, ns, name, key)}
	}
	c.opt.Redactor.Add(string(v))
	if strings.TrimSpace(string(v)) == "" {
		return "", &notReady{ReasonSecretMissing, fmt.Sprintf("%s: Secret %s/%s key %q is empty", field, ns, name, key)}
	}
	return strings.TrimSpace(string(v)), nil
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
	case "not_taking":
		c.recorder.Eventf(obj, corev1.EventTypeWarning, ReasonNotTakingJobs, "runner %s: %s", runner, msg)
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
