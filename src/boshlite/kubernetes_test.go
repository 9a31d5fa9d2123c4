package boshlite

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// The Kubernetes section's steps, in its order.
var kubernetesSteps = []string{"stemcell-bind", "kubernetes-cpi", "kubernetes-deploy", "kubernetes-recreate", "kubernetes-delete"}

// The namespace the guide's Kubernetes CPI config names: the test makes
// it (privileged, the driver's Role bound) and deletes it at the end.
const kubernetesNS = "runway-bosh"

// TestDirectorOnKubernetes: the guide's Director on the host, its CPI the
// Kubernetes driver on the dev cluster: upload of the bind-mode stemcell
// (pushed to the cluster's registry), a deploy compiling a package with a
// persistent disk (a PersistentVolumeClaim), recreate keeping the disk's
// data, delete-deployment and clean-up. After each step that ends
// something, nothing of it is left in the driver's namespace.
func TestDirectorOnKubernetes(t *testing.T) {
	env := testenv.Need(t, "scripts/bosh-dev path and the dev cluster (scripts/k8s-dev); scripts/test's real-callers phase sets them",
		"RUNWAY_BOSH_TOOLS", "RUNWAY_K8S_KUBECONFIG", "RUNWAY_K8S_ADMIN_KUBECONFIG", "RUNWAY_K8S_BIN", "RUNWAY_K8S_REGISTRY_HOST")
	tools, kubeconfig, admin, k8sBin := env[0], env[1], env[2], env[3]
	t.Parallel() // beside TestBoshLite
	// On the host's network: the pods reach it at the cluster link's host end.
	r := newRun(t, tools, "")
	work := r.work
	kubectl := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(k8sBin, "kubectl"), append([]string{"--kubeconfig", admin}, args...)...).CombinedOutput()
		return string(out), err
	}
	rbac, err := os.ReadFile(filepath.Join(r.repo, "docs/kubernetes-rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	kubectl("delete", "namespace", kubernetesNS, "--wait=true") // a run killed half-way
	for _, args := range [][]string{{"create", "namespace", kubernetesNS},
		{"label", "namespace", kubernetesNS, "pod-security.kubernetes.io/enforce=privileged"}} {
		if out, err := kubectl(args...); err != nil {
			t.Fatalf("kubectl %v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() { kubectl("delete", "namespace", kubernetesNS, "--wait=true") })
	cmd := exec.Command(filepath.Join(k8sBin, "kubectl"), "--kubeconfig", admin, "apply", "-f", "-")
	cmd.Stdin = strings.NewReader(strings.ReplaceAll(string(rbac), "\n  namespace: runway\n", "\n  namespace: "+kubernetesNS+"\n"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the driver's Role in %s: %v: %s", kubernetesNS, err, out)
	}
	b, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(work, "kubeconfig"), b, 0o600); err != nil {
		t.Fatal(err)
	}

	// The guide's kubectl: the cluster's.
	for i, e := range r.env {
		if strings.HasPrefix(e, "PATH=") {
			r.env[i] = "PATH=" + k8sBin + ":" + strings.TrimPrefix(e, "PATH=")
		}
	}
	r.step("tools", r.repo)
	r.step("stemcell-bind", r.repo)
	r.step("webapp-release", work)
	for _, s := range []string{"director-env", "postgres", "certificates", "director", "login", "kubernetes-cpi"} {
		r.step(s, work)
	}
	first := countStarts(t, r.step("kubernetes-deploy", work), 1)
	inNamespace(t, kubectl, "deploy", "pods", 1, "persistentvolumeclaims", 1)
	out := r.step("kubernetes-recreate", work)
	countStarts(t, out, first+1)
	inNamespace(t, kubectl, "recreate", "pods", 1, "persistentvolumeclaims", 1)
	r.step("kubernetes-delete", work)
	inNamespace(t, kubectl, "delete-deployment and clean-up --all", "pods", 0, "persistentvolumeclaims", 0, "secrets", 0,
		"volumesnapshots.snapshot.storage.k8s.io", 0)
}

// inNamespace checks how many objects of each kind are in the driver's
// namespace (kind, count, kind, count...), naming those left.
func inNamespace(t *testing.T, kubectl func(...string) (string, error), after string, want ...any) {
	t.Helper()
	for i := 0; i < len(want); i += 2 {
		kind, n := want[i].(string), want[i+1].(int)
		out, err := kubectl("-n", kubernetesNS, "get", kind, "-o", "name")
		if err != nil {
			t.Fatalf("kubectl get %s: %v: %s", kind, err, out)
		}
		names := regexp.MustCompile(`\S+`).FindAllString(out, -1)
		if len(names) != n {
			t.Errorf("after %s: %d %s in %s, want %d: %v", after, len(names), kind, kubernetesNS, n, names)
		}
	}
}
