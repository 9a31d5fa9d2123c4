package controller

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/runway-cpi/runway/src/logging"
)

// A leader whose Lease is not renewed (its process was frozen, or the
// API server is away) stops acting as soon as its last renewal is older
// than the lease less leaseMargin — while it still believes it holds
// the Lease, before its own renewal deadline gives it up, and before
// another replica can take it.
func TestFenceHoldsWhileTheLeaseIsNotRenewed(t *testing.T) {
	kube := kubefake.NewClientset()
	var away atomic.Bool
	kube.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if away.Load() {
			return true, nil, errors.New("the API server is away")
		}
		return false, nil, nil
	})
	started := make(chan struct{})
	var le *leaderelection.LeaderElector
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{LeaseMeta: metav1.ObjectMeta{Name: "l", Namespace: "ns"}, Client: kube.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: "a"}},
		// leaseMargin (3 s) before 4 s: acting ends 1 s after the last renewal.
		LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 200 * time.Millisecond,
		Callbacks: leaderelection.LeaderCallbacks{OnStartedLeading: func(ctx context.Context) { close(started); <-ctx.Done() },
			OnStoppedLeading: func() {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go le.Run(ctx)
	<-started
	if err := fence(le); err != nil {
		t.Fatalf("leading: %v", err)
	}
	away.Store(true)
	for end := time.Now().Add(3 * time.Second); fence(le) == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("still acting 3 s after the last renewal")
		}
	}
	if err := fence(le); !le.IsLeader() || !strings.Contains(err.Error(), "last renewed over") {
		t.Errorf("fenced while the elector still leads: IsLeader %v, %v", le.IsLeader(), err)
	}
}

// The replica that takes the Lease runs the engine under it, with a
// fence that lets it act; the Lease names it; the engine's end is
// LeadThenRun's, and the Lease is given up (ReleaseOnCancel) for the
// next replica. A replica that finds the Lease held by another stands
// by, runs nothing, and ends quietly when told to.
func TestLeadThenRun(t *testing.T) {
	kube := kubefake.NewClientset()
	l := Lease{Name: "runway-controller", Namespace: "runway", Identity: "pod-a_1"}
	stopped := errors.New("the engine stopped")
	var fenceErr error
	var holder string
	err := LeadThenRun(context.Background(), kube, l, logging.Fields{Logger: logging.Discard()}, func(ctx context.Context, fence func() error) error {
		fenceErr = fence()
		lease, err := kube.CoordinationV1().Leases("runway").Get(ctx, "runway-controller", metav1.GetOptions{})
		if err != nil {
			return err
		}
		holder = *lease.Spec.HolderIdentity
		return stopped
	})
	if !errors.Is(err, stopped) || fenceErr != nil || holder != "pod-a_1" {
		t.Fatalf("leading: %v; fence %v; holder %q", err, fenceErr, holder)
	}
	lease, err := kube.CoordinationV1().Leases("runway").Get(context.Background(), "runway-controller", metav1.GetOptions{})
	if err != nil || (lease.Spec.HolderIdentity != nil && *lease.Spec.HolderIdentity == "pod-a_1") {
		t.Errorf("the Lease after the engine stopped: %v, %+v", err, lease.Spec)
	}

	other, now := "pod-b_2", metav1.NewMicroTime(time.Now())
	secs := int32(3600)
	held := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "held", Namespace: "runway"},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &other, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now}}
	kube2 := kubefake.NewClientset(held)
	var looked atomic.Int64
	kube2.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		looked.Add(1)
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var ran atomic.Bool
	go func() {
		done <- LeadThenRun(ctx, kube2, Lease{Name: "held", Namespace: "runway", Identity: "pod-a_1"}, logging.Fields{Logger: logging.Discard()},
			func(context.Context, func() error) error { ran.Store(true); return nil })
	}()
	waitFor(t, 10*time.Second, "the Lease found held by pod-b_2, twice", func() bool { return looked.Load() >= 2 })
	cancel()
	if err := <-done; err != nil || ran.Load() {
		t.Errorf("standing by: %v, ran the engine %v", err, ran.Load())
	}
}

// The leader labels its pod for the webhook Service, and a replica
// starting removes the label its pod may keep from a previous leader's
// run; outside a pod nothing is asked.
func TestMarkLeader(t *testing.T) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "runway-0", Namespace: "runway", Labels: map[string]string{"app": "runway"}}}
	kube := kubefake.NewClientset(pod)
	label := func() (string, bool) {
		p, err := kube.CoreV1().Pods("runway").Get(context.Background(), "runway-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		v, ok := p.Labels[LeaderLabel]
		return v, ok
	}
	log := logging.Fields{Logger: logging.Discard()}
	MarkLeader(context.Background(), kube, "runway", "runway-0", log, true)
	if v, ok := label(); !ok || v != "true" {
		t.Errorf("leading: label %q %v", v, ok)
	}
	MarkLeader(context.Background(), kube, "runway", "runway-0", log, false)
	if v, ok := label(); ok {
		t.Errorf("standing by: label %q kept", v)
	}
	kube.ClearActions()
	MarkLeader(context.Background(), kube, "runway", "", log, true)
	if a := kube.Actions(); len(a) != 0 {
		t.Errorf("outside a pod: %v", a)
	}
}
