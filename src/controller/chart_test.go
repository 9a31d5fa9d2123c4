package controller

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// helm runs the real helm (scripts/helm: helm.sh/helm/v3's CLI) from the
// repository's root.
func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, err := exec.Command("../../scripts/helm", args...).CombinedOutput()
	return string(out), err
}

// The chart lints clean, and renders what Runway needs and no more: the
// three CRDs, a ServiceAccount with a Role of its namespace only (no
// ClusterRole), two replicas with leader election, restricted pods, the
// webhook Service, the forges given as values; sqlite with two replicas
// is refused.
func TestChartLintsAndRenders(t *testing.T) {
	if out, err := helm(t, "lint", "--strict", "config/helm/runway"); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	out, err := helm(t, "template", "rel", "config/helm/runway", "-n", "ci", "--include-crds",
		"--set", "forges[0].name=gh,forges[0].type=github,forges[0].token.name=s,forges[0].token.key=k")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	kinds := map[string]*unstructured.Unstructured{}
	for _, u := range parseObjects(t, []byte(out)) {
		kinds[u.GetKind()+"/"+u.GetName()] = u
	}
	for _, want := range []string{"CustomResourceDefinition/runnergroups.gitea.bpg.pw", "CustomResourceDefinition/forges.runway.io",
		"CustomResourceDefinition/runnergroups.runway.io", "ServiceAccount/rel-runway", "Role/rel-runway", "RoleBinding/rel-runway",
		"Deployment/rel-runway", "Service/rel-runway", "ConfigMap/rel-runway", "Forge/gh"} {
		if kinds[want] == nil {
			t.Errorf("the chart renders no %s", want)
		}
	}
	for k := range kinds {
		if strings.HasPrefix(k, "ClusterRole") {
			t.Errorf("the chart asks for %s: Runway needs its namespace only", k)
		}
	}
	d := kinds["Deployment/rel-runway"]
	if d == nil {
		return
	}
	replicas, _, _ := unstructured.NestedFieldNoCopy(d.Object, "spec", "replicas")
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	c := containers[0].(map[string]any)
	args := strings.Join(toStrings(c["args"]), " ")
	sc := c["securityContext"].(map[string]any)
	if fmt.Sprint(replicas) != "2" || !strings.Contains(args, "-leader-elect=true") || sc["allowPrivilegeEscalation"] != false ||
		sc["readOnlyRootFilesystem"] != true {
		t.Errorf("deployment: replicas %v, args %q, securityContext %v", replicas, args, sc)
	}
	if out, err := helm(t, "template", "rel", "config/helm/runway", "--set", "store.type=sqlite"); err == nil ||
		!strings.Contains(out, "replicas must be 1") {
		t.Errorf("sqlite with two replicas: %v %s", err, out)
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}
