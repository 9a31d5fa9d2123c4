package garm_test

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/runway-cpi/runway/src/testkit/cpibin"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// garm's instances as pods on the dev cluster (scripts/k8s-dev), through
// the same bin/cpi: the pool's image maps to a light stemcell, the
// instance is a pod running its user data, found by id or name, and gone
// after DeleteInstance with its Secret.
func TestInstancesArePods(t *testing.T) {
	env := testenv.Need(t, "scripts/k8s-dev start, then its $K8S_DEV_DIR/env",
		"RUNWAY_K8S_KUBECONFIG", "RUNWAY_K8S_ADMIN_KUBECONFIG", "RUNWAY_K8S_NAMESPACE", "RUNWAY_K8S_TEST_IMAGE")
	bin, err := cpibin.Path("kubernetes")
	if err != nil {
		t.Fatal(err)
	}
	section := map[string]any{"kubeconfig": env[0], "namespace": env[2], "delete_grace_seconds": 1, "wait_timeout_seconds": 60, "owner": "garm-test"}
	// The operator's one step: the image as a light stemcell, mapped.
	g := newCloudGarm(t, "kubernetes", bin, section, "ctl-k8s", "/dev/null", map[string]any{"image": env[3]}, nil)

	rc, err := clientcmd.BuildConfigFromFlags("", env[1])
	if err != nil {
		t.Fatal(err)
	}
	admin := k8s.NewForConfigOrDie(rc)
	ctx := context.Background()

	inst := decode[rawInstance](t, g.ok("CreateInstance", "pool-k", "", bootstrap("runner-pod", "pool-k", quiet)))
	if inst.Status != "running" || len(inst.Addresses) == 0 {
		t.Fatalf("created %+v; want running with the pod's address", inst)
	}
	pod, err := admin.CoreV1().Pods(env[2]).Get(ctx, inst.ProviderID, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("instance %s is no pod: %v", inst.ProviderID, err)
	}
	if pod.Status.PodIP != inst.Addresses[0].Address || !slices.Equal(pod.Spec.Containers[0].Command, []string{"/var/vcap/bosh/user-data"}) {
		t.Errorf("pod %s: ip %s, command %v; want %s and the user data", pod.Name, pod.Status.PodIP, pod.Spec.Containers[0].Command, inst.Addresses[0].Address)
	}
	for _, id := range []string{inst.ProviderID, "runner-pod"} {
		if got := decode[rawInstance](t, g.ok("GetInstance", "pool-k", id, nil)); got.ProviderID != inst.ProviderID || got.Status != "running" {
			t.Errorf("GetInstance(%s) = %+v", id, got)
		}
	}
	if list := decode[[]rawInstance](t, g.ok("ListInstances", "pool-k", "", nil)); len(list) != 1 {
		t.Errorf("ListInstances = %+v; want one", list)
	}
	g.ok("DeleteInstance", "pool-k", "runner-pod", nil)
	if r := g.run("GetInstance", "pool-k", inst.ProviderID, nil); r.code != 30 {
		t.Errorf("instance survived DeleteInstance: exit %d", r.code)
	}
	if _, err := admin.CoreV1().Pods(env[2]).Get(ctx, inst.ProviderID, metav1.GetOptions{}); err == nil {
		t.Error("the pod survived DeleteInstance")
	}
	secs, _ := admin.CoreV1().Secrets(env[2]).List(ctx, metav1.ListOptions{LabelSelector: "runway.io/owner=garm-test"})
	if secs != nil && len(secs.Items) > 0 {
		t.Errorf("secrets left: %v", names(secs.Items))
	}
}

func names(s []corev1.Secret) []string {
	var out []string
	for _, x := range s {
		out = append(out, x.Name)
	}
	return out
}
