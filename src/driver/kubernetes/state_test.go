package kubernetes

import (
	"context"
	"errors"
	"maps"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/runway-cpi/runway/src/driver"
)

// list_vms' state for a pod: a process that ended with 0 is a stopped VM
// even before the kubelet moves the phase on (an ephemeral runner's end,
// which the orchestrator reads as "job done", not "broken").
func TestStateOf(t *testing.T) {
	exited := func(phase corev1.PodPhase, code int32) *corev1.Pod {
		return &corev1.Pod{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever},
			Status: corev1.PodStatus{Phase: phase, ContainerStatuses: []corev1.ContainerStatus{{
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code, Reason: "Completed"}}}}}}
	}
	running := &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}}
	for _, tc := range []struct {
		name string
		pod  *corev1.Pod
		want string
	}{
		{"running", running, "running"},
		{"exit 0, phase not yet moved", exited(corev1.PodRunning, 0), "stopped"},
		{"exit 0, Succeeded", exited(corev1.PodSucceeded, 0), "stopped"},
		{"exit 1, phase not yet moved", exited(corev1.PodRunning, 1), "error"},
		{"exit 1, Failed", exited(corev1.PodFailed, 1), "error"},
		{"pending", &corev1.Pod{Status: corev1.PodStatus{Phase: corev1.PodPending}}, "unknown"},
	} {
		if got := stateOf(tc.pod); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A process that ended with 0 before create_vm's watch saw its pod run (an
// ephemeral runner whose job was shorter than the kubelet's status sync:
// the chart e2e's runner did so on a loaded machine, and create_vm called
// it a failure) ran: the wait answers the pod. One that ended otherwise
// is still a typed failure. A fake clientset: on a cluster, whether the
// watch sees Running first is the kubelet's timing.
func TestWaitRunningTakesACleanExit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		phase corev1.PodPhase
		code  int32
		ran   bool
	}{
		{"exit 0, Succeeded", corev1.PodSucceeded, 0, true},
		{"exit 0, phase not yet moved", corev1.PodPending, 0, true},
		{"exit 3, Failed", corev1.PodFailed, 3, false},
		{"exit 3, phase not yet moved", corev1.PodPending, 3, false},
	} {
		reason := "Completed" // the kubelet's reasons for the two exits
		if tc.code != 0 {
			reason = "Error"
		}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "vm-done", Namespace: "ns"},
			Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever},
			Status: corev1.PodStatus{Phase: tc.phase, ContainerStatuses: []corev1.ContainerStatus{{
				State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: tc.code, Reason: reason}}}}}}
		// The fake's own list and watch do not take the wait's field
		// selector: both answer the pod (the watch as a streaming list
		// does: the pod, then the initial events' end).
		pod.ResourceVersion = "1"
		cs := fake.NewSimpleClientset()
		cs.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			return true, &corev1.PodList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: []corev1.Pod{*pod}}, nil
		})
		cs.PrependWatchReactor("pods", func(k8stesting.Action) (bool, watch.Interface, error) {
			w := watch.NewFakeWithChanSize(2, false)
			w.Add(pod.DeepCopy())
			w.Action(watch.Bookmark, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "1",
				Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}})
			return true, w, nil
		})
		d := &Driver{cs: cs, ns: "ns", cfg: Config{WaitTimeoutSeconds: 10}}
		got, err := d.waitRunning(context.Background(), pod)
		var pf *podFailure
		switch {
		case tc.ran && (err != nil || got == nil || got.Name != pod.Name):
			t.Errorf("%s: %v, %v; want the pod", tc.name, got, err)
		case !tc.ran && (!errors.As(err, &pf) || pf.Reason != "Terminated"):
			// Not a timeout, which is a podFailure too: the exit itself.
			t.Errorf("%s: %v; want the pod's termination", tc.name, err)
		}
	}
}

// Tags whose keys cannot end an annotation key (a space, a second '/')
// live in one JSON annotation, merged on each change; every tag reads back
// exactly.
func TestTagsThatAreNoAnnotationKeys(t *testing.T) {
	first := map[string]string{"deployment": "dep", "director name": "my director", "a/b/c": "x y"}
	labels, annos := map[string]string{}, map[string]string{}
	tagMeta(first, labels, annos)
	for k := range annos {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			t.Errorf("annotation key %q: %v", k, errs)
		}
	}
	if labels[labelPrefix+"deployment"] != "dep" || len(labels) != 1 {
		t.Errorf("labels %v; want the one label-safe tag", labels)
	}
	if got := tagsOf(annos); !maps.Equal(got, first) {
		t.Errorf("read back %v; want %v", got, first)
	}
	// A later set_vm_metadata: the patch keeps the earlier odd keys.
	patch := map[string]string{annoOddTags: annos[annoOddTags]}
	tagMeta(map[string]string{"job name": "web"}, map[string]string{}, patch)
	merged := maps.Clone(annos)
	maps.Copy(merged, patch)
	want := maps.Clone(first)
	want["job name"] = "web"
	if got := tagsOf(merged); !maps.Equal(got, want) {
		t.Errorf("after a second change %v; want %v", got, want)
	}
}

// Kubernetes expands "$(NAME)" and "$$" in a container's command and env;
// the pod carries them escaped, so the VM's process sees them as written.
func TestCommandAndEnvAreLiteral(t *testing.T) {
	d := &Driver{cfg: Config{Owner: defaultOwner, RunAsUser: 1000}}
	p := vmProps{Env: map[string]string{"PRICE": "$(HOME)$5"}, RestartPolicy: corev1.RestartPolicyNever}
	pod := d.podFor("vm-x", driver.VMSpec{AgentID: "a"}, p, "img", []string{"/bin/sh", "-c", "echo $$ $(RUNWAY_VM_CID)"}, nil)
	c := pod.Spec.Containers[0]
	if got := c.Command[2]; got != "echo $$$$ $$(RUNWAY_VM_CID)" {
		t.Errorf("command %q", got)
	}
	for _, e := range c.Env {
		if e.Name == "PRICE" && e.Value != "$$(HOME)$$5" {
			t.Errorf("env %q", e.Value)
		}
	}
}
