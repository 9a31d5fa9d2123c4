package controller

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/runway-cpi/runway/src/logging"
)

// Lease is the Lease the replicas take turns holding: only its holder
// acts.
type Lease struct {
	Name, Namespace string
	// Identity is this replica's name in it.
	Identity string
}

// LeadThenRun runs run while this replica holds the Lease, with a fence
// saying whether it may still act (Options.Fence, orchestrator's
// Options.Fence). Losing the Lease ends the process's work (the pod
// restarts as a standby): the engine's runner rows are in the shared
// store for the next leader.
func LeadThenRun(ctx context.Context, kube kubernetes.Interface, l Lease, log logging.Fields,
	run func(context.Context, func() error) error) error {
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var runErr error
	var started atomic.Bool
	finished := make(chan struct{})
	var le *leaderelection.LeaderElector
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Name: l.Name, Namespace: l.Namespace}, Client: kube.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: l.Identity}},
		// A replica that dies leaves the Lease to expire: the other takes
		// it within LeaseDuration + RetryPeriod (9 s).
		LeaseDuration: leaseDuration, RenewDeadline: 6 * time.Second, RetryPeriod: time.Second,
		ReleaseOnCancel: true, Name: l.Name,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				started.Store(true)
				defer close(finished)
				log.Info("leading: running the engine and the controller", "identity", l.Identity)
				runErr = run(ctx, func() error { return fence(le) })
				cancel() // the engine stopped: give up the Lease
			},
			OnStoppedLeading: func() { log.Info("not leading", "identity", l.Identity) },
			OnNewLeader: func(id string) {
				if id != l.Identity {
					log.Info("standing by", "leader", id)
				}
			},
		},
	})
	if err != nil {
		return err
	}
	le.Run(lctx)
	if !started.Load() {
		return nil // stopped while standing by
	}
	<-finished
	if runErr == nil && ctx.Err() == nil {
		// The Lease was lost while the engine ran: stop here (the pod
		// restarts as a standby; the rows are in the shared store).
		return errors.New("lost the Lease")
	}
	return runErr
}

// leaseMargin: the engine stops acting once the Lease was last renewed
// longer than LeaseDuration - leaseMargin ago, before another replica
// may take it (it waits LeaseDuration from its own last sight of it).
const (
	leaseDuration = 8 * time.Second
	leaseMargin   = 3 * time.Second
)

// fence says why the engine may not act: the Lease is another's, or its
// last renewal is too old to be sure it is still this replica's — a
// process frozen (SIGSTOP) and resumed learns it has lost the Lease only
// when its next renewal fails, and must not act meanwhile. The time is
// the monotonic clock's, which runs while a process is stopped.
func fence(le *leaderelection.LeaderElector) error {
	if !le.IsLeader() {
		return errors.New("this replica no longer holds the Lease")
	}
	if err := le.Check(-leaseMargin); err != nil {
		return fmt.Errorf("the Lease was last renewed over %s ago (this process was stopped, or the API server is away): "+
			"another replica may lead", leaseDuration-leaseMargin)
	}
	return nil
}

// LeaderLabel marks the leading replica's pod: the webhook Service
// selects it.
const LeaderLabel = "runway.io/leader"

// MarkLeader sets (or removes) LeaderLabel on this replica's pod (none
// outside a pod: pod empty).
func MarkLeader(ctx context.Context, kube kubernetes.Interface, ns, pod string, log logging.Fields, leading bool) {
	if pod == "" || ns == "" {
		return
	}
	v := "null"
	if leading {
		v = `"true"`
	}
	patch := []byte(`{"metadata":{"labels":{"` + LeaderLabel + `":` + v + `}}}`)
	if _, err := kube.CoreV1().Pods(ns).Patch(ctx, pod, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		log.Warn("labelling this pod for the webhook Service", "pod", pod, "leading", leading, "err", err)
	}
}
