package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// installBlock is docs/kubernetes.md's install: the second sh block under
// "### Install" (the first sets what is the reader's), as written.
func installBlock(t testing.TB) string {
	b, err := os.ReadFile(filepath.Join(root, "docs", "kubernetes.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n### Install\n")
	if !ok {
		t.Fatal("docs/kubernetes.md has no ### Install")
	}
	section, _, _ = strings.Cut(section, "\n### ")
	var blocks []string
	for rest := section; ; {
		_, after, ok := strings.Cut(rest, "\n```sh\n")
		if !ok {
			break
		}
		block, tail, _ := strings.Cut(after, "\n```\n")
		blocks = append(blocks, block)
		rest = tail
	}
	if len(blocks) != 2 {
		t.Fatalf("### Install has %d sh blocks, want the settings and the install", len(blocks))
	}
	return blocks[1]
}

// docInstall runs the doc's install block as it is, from the
// repository's root, with the cluster's settings in the variables the
// doc has the reader set (kubectl from the cluster's binaries), and the
// chart values values in $VALUES.
func (c *cluster) docInstall(dsn, values string) {
	t := c.t
	block := installBlock(t)
	vf := filepath.Join(t.TempDir(), "runway-values.yaml")
	if err := os.WriteFile(vf, []byte(values), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-euo", "pipefail", "-c", block)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.kubeconfig, "REGISTRY="+c.registry, "NAMESPACE="+c.ns, "DSN="+dsn, "VALUES="+vf,
		"PATH="+os.Getenv("RUNWAY_K8S_BIN")+":"+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docs/kubernetes.md's install: %v\n%s\n%s", err, out, c.logs())
	}
	// The runner image the block pushed, as the chart runs it.
	d, err := c.kube.AppsV1().Deployments(c.ns).Get(context.Background(), c.fullname(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		if img, ok := strings.CutPrefix(a, "-seed-image="); ok {
			c.runnerImg = img
		}
	}
}
