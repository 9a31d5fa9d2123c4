package e2e

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/runway-cpi/runway/src/testkit/kubeyaml"
)

// condition is an object's Ready condition (nil: none yet).
func (c *cluster) condition(gvr schema.GroupVersionResource, ns, name string) map[string]any {
	u, err := c.dyn.Resource(gvr).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return nil
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, cd := range conds {
		if m := cd.(map[string]any); m["type"] == "Ready" {
			return m
		}
	}
	return nil
}

// hostile is what the attacker applied in the namespace.
type hostile struct{ c *cluster }

// hostileSpecs applies, as a namespace's user may: a seed group whose
// authToken is the store's DSN (the unit test's, from testdata); seed
// groups whose gitea.url is the API server (also the node: its kubelet)
// and the metadata address; a Forge and a group whose runners would
// tolerate every taint (their job is queued by the caller: labels
// [tainted]; token is the forge's).
func (c *cluster) hostileSpecs(token string) hostile {
	c.apply(kubeyaml.Read(c.t, root+"/src/controller/testdata/hostile-steal-dsn.yaml"))
	for name, url := range map[string]string{"reach-api": os.Getenv("RUNWAY_K8S_API"), "reach-metadata": "http://169.254.169.254"} {
		c.apply(parseYAML(c.t, fmt.Sprintf(`
apiVersion: gitea.bpg.pw/v1alpha1
kind: RunnerGroup
metadata: {name: %s}
spec:
  scope: global
  gitea: {url: %q}
  maxActiveRunners: 1
  registrationToken: {secretRef: {name: gitea-registration-token, key: token}}
  authToken: {secretRef: {name: gitea-auth-token, key: token}}
`, name, url)))
	}
	c.apply(parseYAML(c.t, fmt.Sprintf(`
apiVersion: v1
kind: Secret
metadata: {name: forge-token}
stringData: {token: %s}
---
apiVersion: runway.io/v1alpha1
kind: Forge
metadata: {name: gitea}
spec: {type: gitea, url: "http://gitea.runway.test:3000", token: {name: forge-token, key: token}, pollInterval: 500ms}
---
apiVersion: runway.io/v1alpha1
kind: RunnerGroup
metadata: {name: tolerate-all}
spec:
  forge: gitea
  scope: org
  org: acme
  labels: [tainted]
  maxActiveRunners: 1
  image: %s
  runner: {command: %s}
  cloudProperties: {tolerations: [{operator: Exists}]}
`, token, c.runnerImg, runnerCmd)))
	return hostile{c}
}

// check waits for each hostile spec's refusal and checks nothing came of
// it; the chart's Role and admission policy, as Runway's account.
func (h hostile) check() {
	c, t := h.c, h.c.t
	for _, w := range []struct {
		gvr          schema.GroupVersionResource
		name, reason string
		says         []string
	}{
		{seedGVR, "steal-dsn", "SecretNotAllowed", []string{"spec.authToken", "runway-postgres"}},
		{seedGVR, "reach-api", "ForgeAddressRefused", []string{"the cluster's API server"}},
		{seedGVR, "reach-metadata", "ForgeAddressRefused", []string{"link-local"}},
		{groupGVR, "tolerate-all", "ReconcileFailed", []string{"cloud_properties.tolerations[0]", "allowed_tolerations"}},
	} {
		c.waitFor(90*time.Second, w.name+": "+w.reason, func() bool {
			cond := c.condition(w.gvr, c.ns, w.name)
			return cond != nil && cond["reason"] == w.reason
		})
		msg := fmt.Sprint(c.condition(w.gvr, c.ns, w.name)["message"])
		for _, s := range w.says {
			if !strings.Contains(msg, s) {
				t.Errorf("%s's condition %q does not say %q", w.name, msg, s)
			}
		}
		if strings.Contains(msg, "postgres://") {
			t.Errorf("%s's condition holds the DSN: %q", w.name, msg)
		}
		t.Logf("hostile %s: %s: %s", w.name, w.reason, msg)
	}
	if n := c.runnerPods(); n != 0 {
		t.Errorf("%d runner pods made for the hostile specs", n)
	}
	// Runway's own account: the DSN's Secret and any other not named
	// cannot be read; a pod as Runway's account cannot be made.
	cfg, err := clientcmd.BuildConfigFromFlags("", c.kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Impersonate.UserName = "system:serviceaccount:" + c.ns + ":" + c.fullname()
	as := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	if _, err := as.CoreV1().Secrets(c.ns).Get(ctx, "runway-postgres", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("Runway's account reading runway-postgres: %v, want Forbidden", err)
	}
	if _, err := as.CoreV1().Secrets(c.ns).List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("Runway's account listing Secrets: %v, want Forbidden", err)
	}
	if _, err := as.CoreV1().Secrets(c.ns).Get(ctx, "gitea-auth-token", metav1.GetOptions{}); err != nil {
		t.Errorf("Runway's account reading a Secret of secrets.names: %v", err)
	}
	pod := func(sa string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{GenerateName: "as-runway-"}, Spec: corev1.PodSpec{ServiceAccountName: sa,
			AutomountServiceAccountToken: ptr.To(sa != ""),
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](1000),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{Name: "c", Image: c.runnerImg, SecurityContext: &corev1.SecurityContext{
				AllowPrivilegeEscalation: ptr.To(false), Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}}}}}
	}
	dry := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	if _, err := as.CoreV1().Pods(c.ns).Create(ctx, pod(c.fullname()), dry); err == nil || !strings.Contains(err.Error(), "runners.serviceAccounts") {
		t.Errorf("a pod as Runway's own account, made by it: %v, want the admission policy's refusal", err)
	}
	if _, err := as.CoreV1().Pods(c.ns).Create(ctx, pod(""), dry); err != nil {
		t.Errorf("a runner pod as the driver makes it: %v", err)
	}
}
