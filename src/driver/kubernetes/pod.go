package kubernetes

// Watching pods: until they run, cannot, or are gone.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"
	"k8s.io/utils/ptr"

	"github.com/runway-cpi/runway/src/driver"
)

// podFailure is a typed create_vm error: the pod cannot come up.
type podFailure struct {
	Pod, Reason, Message string
}

func (e *podFailure) Error() string {
	return fmt.Sprintf("pod %s: %s: %s", e.Pod, e.Reason, e.Message)
}

// fatalWaiting are container states that do not heal by waiting.
var fatalWaiting = map[string]bool{"ErrImagePull": true, "ImagePullBackOff": true, "InvalidImageName": true,
	"CrashLoopBackOff": true, "CreateContainerConfigError": true, "CreateContainerError": true,
	"RunContainerError": true, "ErrImageNeverPull": true}

// failureOf is why pod cannot run, or nil while it still may. A pod that
// ended with 0 is no failure: its callers ask stateOf first.
func failureOf(pod *corev1.Pod) *podFailure {
	for _, s := range pod.Status.ContainerStatuses {
		if w := s.State.Waiting; w != nil && fatalWaiting[w.Reason] {
			return &podFailure{Pod: pod.Name, Reason: w.Reason, Message: w.Message}
		}
		if t := s.State.Terminated; t != nil && pod.Spec.RestartPolicy == corev1.RestartPolicyNever {
			return &podFailure{Pod: pod.Name, Reason: "Terminated", Message: fmt.Sprintf("%s, exit code %d %s", t.Reason, t.ExitCode, t.Message)}
		}
	}
	for _, c := range pod.Status.Conditions {
		// Unschedulable for want of a volume binding may heal; for want of
		// resources or a matching node it does not, without an autoscaler.
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable &&
			!strings.Contains(c.Message, "PersistentVolumeClaim") {
			return &podFailure{Pod: pod.Name, Reason: c.Reason, Message: c.Message}
		}
	}
	if pod.Status.Phase == corev1.PodFailed {
		return &podFailure{Pod: pod.Name, Reason: string(pod.Status.Phase), Message: pod.Status.Message}
	}
	return nil
}

// waitRunning watches pod made until it runs, cannot, or the wait times
// out. A pod in a user namespace is watched through its events too: the
// kubelet says only there that the runtime cannot make one.
func (d *Driver) waitRunning(ctx context.Context, made *corev1.Pod) (*corev1.Pod, error) {
	cid := made.Name
	ctx, cancel := context.WithTimeout(ctx, d.cfg.waitTimeout())
	defer cancel()
	ctx, fatal := context.WithCancelCause(ctx)
	defer fatal(nil)
	if hu := made.Spec.HostUsers; hu != nil && !*hu {
		go d.watchFatalEvents(ctx, made, fatal)
	}
	var last *corev1.Pod
	_, err := watchtools.UntilWithSync(ctx, d.podWatch(cid), &corev1.Pod{}, nil, func(ev watch.Event) (bool, error) {
		if ev.Type == watch.Deleted {
			return false, &podFailure{Pod: cid, Reason: "Deleted", Message: "the pod was deleted while it started"}
		}
		pod, ok := ev.Object.(*corev1.Pod)
		if !ok {
			return false, nil
		}
		last = pod
		// A process that ended with 0 before the watch saw the pod run (an
		// ephemeral runner whose job took less than the kubelet's status
		// sync) ran: the VM was made, and is stopped (stateOf).
		if stateOf(pod) == "stopped" {
			return true, nil
		}
		if f := failureOf(pod); f != nil {
			return false, f
		}
		return pod.Status.Phase == corev1.PodRunning, nil
	})
	var f *podFailure
	switch {
	case err == nil:
		return last, nil
	case errors.As(context.Cause(ctx), &f):
		return nil, f
	case errors.As(err, &f):
		if reason, msg := d.lastWarning(cid); reason != "" && f.Reason != reason {
			f.Message += " (event " + reason + ": " + msg + ")"
		}
		return nil, f
	case ctx.Err() != nil:
		reason, msg := d.lastWarning(cid)
		phase := "unknown"
		if last != nil {
			phase = string(last.Status.Phase)
		}
		if reason == "" {
			reason, msg = "Timeout", "no warning event"
		}
		return nil, &podFailure{Pod: cid, Reason: reason, Message: fmt.Sprintf("%s (still %s after %s)", msg, phase, d.cfg.waitTimeout())}
	}
	return nil, d.apiErr("watch pod "+cid, err)
}

// podWatch lists and watches the one pod named cid.
func (d *Driver) podWatch(cid string) cache.ListerWatcher {
	pods := d.cs.CoreV1().Pods(d.ns)
	return byName(cid, pods.List, pods.Watch)
}

// byName lists and watches the one object called name (a field selector
// on metadata.name), for UntilWithSync.
func byName[L runtime.Object](name string, list func(context.Context, metav1.ListOptions) (L, error),
	watchFn func(context.Context, metav1.ListOptions) (watch.Interface, error)) cache.ListerWatcher {
	sel := fields.OneTermEqualSelector("metadata.name", name).String()
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = sel
			return list(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = sel
			return watchFn(ctx, o)
		},
	}
}

// lastWarning is the newest Warning event of pod cid (reason, message).
func (d *Driver) lastWarning(cid string) (string, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	evs, err := d.cs.CoreV1().Events(d.ns).List(ctx, metav1.ListOptions{FieldSelector: fields.AndSelectors(
		fields.OneTermEqualSelector("involvedObject.name", cid), fields.OneTermEqualSelector("involvedObject.kind", "Pod"),
		fields.OneTermEqualSelector("type", corev1.EventTypeWarning)).String()})
	if err != nil || len(evs.Items) == 0 {
		return "", ""
	}
	newest := slices.MaxFunc(evs.Items, func(a, b corev1.Event) int { return eventTime(a).Compare(eventTime(b)) })
	return newest.Reason, newest.Message
}

func eventTime(e corev1.Event) time.Time {
	if !e.LastTimestamp.IsZero() {
		return e.LastTimestamp.Time
	}
	if !e.EventTime.IsZero() {
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// deletePod deletes pod cid and watches until it is gone.
func (d *Driver) deletePod(ctx context.Context, cid string) error {
	var uid types.UID
	err := d.do(ctx, "delete pod "+cid, func(ctx context.Context) error {
		pod, err := d.cs.CoreV1().Pods(d.ns).Get(ctx, cid, metav1.GetOptions{})
		if err != nil {
			return err
		}
		uid = pod.UID
		// Its settings Secret goes with it (owner reference), later: the
		// garbage collector's own time, so callers that need it gone
		// delete it themselves.
		return d.cs.CoreV1().Pods(d.ns).Delete(ctx, cid, metav1.DeleteOptions{GracePeriodSeconds: ptr.To(d.cfg.grace()),
			Preconditions: &metav1.Preconditions{UID: &uid}})
	})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("pod %s: %w", cid, driver.ErrVMNotFound)
	}
	if err != nil {
		return d.apiErr("delete pod "+cid, err)
	}
	return d.waitGone(ctx, cid, uid)
}

// waitGone watches until pod cid (of uid) no longer exists.
func (d *Driver) waitGone(ctx context.Context, cid string, uid types.UID) error {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.waitTimeout()+time.Duration(d.cfg.grace())*time.Second)
	defer cancel()
	_, err := watchtools.UntilWithSync(ctx, d.podWatch(cid), &corev1.Pod{}, func(store cache.Store) (bool, error) {
		for _, o := range store.List() {
			if p, ok := o.(*corev1.Pod); ok && p.UID == uid {
				return false, nil
			}
		}
		return true, nil
	}, func(ev watch.Event) (bool, error) {
		if p, ok := ev.Object.(*corev1.Pod); ok && ev.Type == watch.Deleted && p.UID == uid {
			return true, nil
		}
		if p, ok := ev.Object.(*corev1.Pod); ok && p.UID != uid {
			return true, nil // a new pod of that name: the old one is gone
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for pod %s to go: %w", cid, err)
	}
	return nil
}
