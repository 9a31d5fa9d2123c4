package kubernetes

// The agent profile in a user namespace: what the kubelet says when the
// node's runtime cannot make one, and the error create_vm answers then.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/utils/ptr"
)

// fatalEvents are Warning events (reason, words of the message) saying
// a pod will never run though its status does not: the kubelet keeps
// trying the sandbox. Observed on the dev cluster (kubelet v1.37,
// containerd 1.6, which reports no runtime handlers): a pod with
// hostUsers false stays Pending with FailedCreatePodSandBox "can't set
// `spec.hostUsers: false`, runtime does not support user namespaces".
var fatalEvents = []struct{ reason, words string }{
	{"FailedCreatePodSandBox", "does not support user namespaces"},
}

// watchFatalEvents watches pod's Warning events until ctx ends, and ends
// it (fatal) with the pod's failure at the first fatal one. Without the
// right to watch events (an older Role), the wait is the pod's alone.
func (d *Driver) watchFatalEvents(ctx context.Context, pod *corev1.Pod, fatal context.CancelCauseFunc) {
	events := d.cs.CoreV1().Events(d.ns)
	opts := metav1.ListOptions{FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("involvedObject.uid", string(pod.UID)),
		fields.OneTermEqualSelector("type", corev1.EventTypeWarning)).String()}
	for ctx.Err() == nil {
		list, err := events.List(ctx, opts)
		if ctx.Err() != nil {
			return // the wait is over
		}
		if err != nil {
			d.Log.Info("pod events cannot be listed: waiting on the pod alone", "vm", pod.Name, "err", err)
			return
		}
		for i := range list.Items {
			if f := fatalEvent(pod.Name, &list.Items[i]); f != nil {
				fatal(f)
				return
			}
		}
		o := opts
		o.ResourceVersion = list.ResourceVersion
		w, err := events.Watch(ctx, o)
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			d.Log.Info("pod events cannot be watched: waiting on the pod alone", "vm", pod.Name, "err", err)
			return
		}
		for ev := range w.ResultChan() {
			if e, ok := ev.Object.(*corev1.Event); ok {
				if f := fatalEvent(pod.Name, e); f != nil {
					w.Stop()
					fatal(f)
					return
				}
			}
		}
		w.Stop()
	}
}

func fatalEvent(cid string, e *corev1.Event) *podFailure {
	for _, f := range fatalEvents {
		if e.Reason == f.reason && strings.Contains(e.Message, f.words) {
			return &podFailure{Pod: cid, Reason: e.Reason, Message: e.Message}
		}
	}
	return nil
}

// agentUsers puts an agent pod in a user namespace of its own unless the
// config allows host-equivalent agent pods: at create_vm, and again each
// time the pod is made anew (a reboot follows a changed config).
func (d *Driver) agentUsers(spec *corev1.PodSpec) {
	spec.HostUsers = nil
	if !d.cfg.HostEquivalentAgents {
		spec.HostUsers = ptr.To(false)
	}
}

// isAgent: the pod has the agent profile (the only pods running as root).
func isAgent(spec *corev1.PodSpec) bool {
	sc := spec.SecurityContext
	return sc != nil && sc.RunAsUser != nil && *sc.RunAsUser == 0
}

// noUserNamespaces: err is the kubelet saying the runtime cannot put the
// pod in a user namespace.
func noUserNamespaces(err error) bool {
	var f *podFailure
	return errors.As(err, &f) && f.Reason == "FailedCreatePodSandBox" && strings.Contains(f.Message, "user namespaces")
}

// agentWithoutUserNamespace is create_vm's answer then: what happened,
// and the key that would allow an agent pod without one.
func agentWithoutUserNamespace(err error) error {
	return fmt.Errorf("cloud_properties.bosh_agent: the node's container runtime cannot run the agent pod in a user namespace of its own, "+
		"and without one its root is root on the node; set kubernetes.host_equivalent_agents to allow such pods: %w", err)
}
