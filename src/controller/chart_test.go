package controller

import (
	"fmt"
	"os/exec"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/runway-cpi/runway/src/testkit/kubeyaml"
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
// webhook Service, the forges given as values (a token's Secret, or a
// GitHub App's in ARC's githubConfigSecret form); sqlite with two
// replicas is refused.
func TestChartLintsAndRenders(t *testing.T) {
	if out, err := helm(t, "lint", "--strict", "config/helm/runway"); err != nil {
		t.Fatalf("helm lint: %v\n%s", err, out)
	}
	out, err := helm(t, "template", "rel", "config/helm/runway", "-n", "ci", "--include-crds",
		"--set", "forges[0].name=gh,forges[0].type=github,forges[0].token.name=s,forges[0].token.key=k",
		"--set", "forges[1].name=app,forges[1].type=github,forges[1].githubConfigSecret=gh-app")
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	kinds := map[string]*unstructured.Unstructured{}
	for _, u := range kubeyaml.Parse(t, []byte(out)) {
		kinds[u.GetKind()+"/"+u.GetName()] = u
	}
	for _, want := range []string{"CustomResourceDefinition/runnergroups.gitea.bpg.pw", "CustomResourceDefinition/forges.runway.io",
		"CustomResourceDefinition/runnergroups.runway.io", "ServiceAccount/rel-runway", "Role/rel-runway", "RoleBinding/rel-runway",
		"Deployment/rel-runway", "Service/rel-runway", "ConfigMap/rel-runway", "Forge/gh", "Forge/app"} {
		if kinds[want] == nil {
			t.Errorf("the chart renders no %s", want)
		}
	}
	if f := kinds["Forge/app"]; f != nil {
		if s, _, _ := unstructured.NestedString(f.Object, "spec", "githubConfigSecret"); s != "gh-app" {
			t.Errorf("the App's forge: %v", f.Object["spec"])
		}
		if _, has, _ := unstructured.NestedFieldNoCopy(f.Object, "spec", "token"); has {
			t.Errorf("the App's forge names a token too")
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

// The Role reads Secrets by name only (secrets.names, and the Secrets of
// the forges given as values), or every Secret with secrets.byLabel
// alone; makes and deletes the runner pods' settings Secrets but reads
// none back; takes its Lease by name; the admission policy holds the
// pods its service account makes to runners.serviceAccounts. The
// store's DSN cannot be allow-listed.
func TestChartRoleIsNarrow(t *testing.T) {
	render := func(args ...string) map[string]*unstructured.Unstructured {
		t.Helper()
		out, err := helm(t, append([]string{"template", "rel", "config/helm/runway", "-n", "ci"}, args...)...)
		if err != nil {
			t.Fatalf("helm template: %v\n%s", err, out)
		}
		kinds := map[string]*unstructured.Unstructured{}
		for _, u := range kubeyaml.Parse(t, []byte(out)) {
			kinds[u.GetKind()] = u
		}
		return kinds
	}
	// rules: the Role's verbs by resource, each verb with its resourceNames
	// ("*": any).
	rules := func(role *unstructured.Unstructured) map[string]map[string]string {
		out := map[string]map[string]string{}
		rs, _, _ := unstructured.NestedSlice(role.Object, "rules")
		for _, r := range rs {
			m := r.(map[string]any)
			names := "*"
			if n, ok := m["resourceNames"]; ok {
				names = strings.Join(toStrings(n), ",")
			}
			for _, res := range toStrings(m["resources"]) {
				if out[res] == nil {
					out[res] = map[string]string{}
				}
				for _, v := range toStrings(m["verbs"]) {
					out[res][v] = names
				}
			}
		}
		return out
	}
	k := render("--set", "secrets.names={gitea-auth-token}", "--set", "forgeURLs.deny={10.0.0.0/16}", "--set",
		"forges[0].name=gh,forges[0].type=github,forges[0].token.name=gh-token,forges[0].token.key=k,forges[0].webhookSecret.name=gh-hook,forges[0].webhookSecret.key=h",
		"--set", "forges[1].name=app,forges[1].type=github,forges[1].githubConfigSecret=gh-app")
	r := rules(k["Role"])
	for _, v := range []string{"get", "list", "watch"} {
		if got := r["secrets"][v]; got != "gitea-auth-token,gh-token,gh-hook,gh-app" {
			t.Errorf("secrets %s: %q, want the four named (an App's githubConfigSecret among them)", v, got)
		}
	}
	if r["secrets"]["patch"] != "" || r["secrets"]["update"] != "" || r["secrets"]["create"] != "*" || r["secrets"]["delete"] != "*" {
		t.Errorf("secrets: %v, want create and delete (settings) and no patch or update (each reads a Secret back)", r["secrets"])
	}
	if r["leases"]["get"] != "rel-runway" || r["leases"]["update"] != "rel-runway" || r["leases"]["list"] != "" {
		t.Errorf("leases: %v, want get and update of rel-runway only", r["leases"])
	}
	d := k["Deployment"]
	containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	args := strings.Join(toStrings(containers[0].(map[string]any)["args"]), " ")
	env := fmt.Sprint(containers[0].(map[string]any)["env"])
	if !strings.Contains(args, "-secret-names=gitea-auth-token,gh-token,gh-hook,gh-app") || !strings.Contains(args, "-secrets-by-label=false") ||
		!strings.Contains(args, "-forge-deny=10.0.0.0/16") || !strings.Contains(env, "status.hostIPs") {
		t.Errorf("args %q, env %s", args, env)
	}
	vap := k["ValidatingAdmissionPolicy"]
	if vap == nil || k["ValidatingAdmissionPolicyBinding"] == nil {
		t.Fatal("no ValidatingAdmissionPolicy and binding for the runner pods")
	}
	expr := fmt.Sprint(vap.Object["spec"])
	if !strings.Contains(expr, "system:serviceaccount:ci:rel-runway") || !strings.Contains(expr, "automountServiceAccountToken") {
		t.Errorf("policy %s", expr)
	}

	if r := rules(render("--set", "secrets.byLabel=true")["Role"]); r["secrets"]["list"] != "*" {
		t.Errorf("byLabel: secrets %v", r["secrets"])
	}
	if r := rules(render()["Role"]); r["secrets"]["get"] != "" || r["secrets"]["list"] != "" {
		t.Errorf("no Secret named: secrets %v, want none read", r["secrets"])
	}
	// Several watched namespaces: a Role in each, the runner pods' and the
	// Lease's rules in the release's only.
	out, err := helm(t, "template", "rel", "config/helm/runway", "-n", "ci", "--set", "watchNamespaces={ci,team-b}", "--set", "secrets.names={t}")
	if err != nil {
		t.Fatal(err)
	}
	roles := map[string]map[string]map[string]string{}
	for _, u := range kubeyaml.Parse(t, []byte(out)) {
		if u.GetKind() == "Role" {
			roles[u.GetNamespace()] = rules(u)
		}
	}
	if len(roles) != 2 || roles["team-b"]["secrets"]["get"] != "t" || roles["team-b"]["pods"] != nil || roles["ci"]["pods"]["create"] != "*" ||
		roles["team-b"]["leases"] != nil {
		t.Errorf("roles by namespace: %v", roles)
	}
	if !strings.Contains(out, "-namespace=ci,team-b") {
		t.Error("the controller is not told to watch both namespaces")
	}
	if out, err := helm(t, "template", "rel", "config/helm/runway", "--set", "secrets.names={runway-postgres}"); err == nil ||
		!strings.Contains(out, "the store's DSN") {
		t.Errorf("the DSN's Secret allow-listed: %v %s", err, out)
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}
