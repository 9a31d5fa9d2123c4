package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/testkit/cpibin"
	"github.com/runway-cpi/runway/src/testkit/rootfs"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// The orchestrator unchanged, its CPI the kubernetes driver on the dev
// cluster (scripts/k8s-dev): the runner stemcell is a rootfs tarball
// holding the test runner, pushed to the cluster's registry by
// create_stemcell; every runner is a pod, started by its user data (the
// bootstrap), reaching the forge only at the host's end of the cluster's
// link; each pod is deleted once its job is done.
func TestRunnersInPods(t *testing.T) {
	env := testenv.Need(t, "scripts/k8s-dev start, then its $K8S_DEV_DIR/env",
		"RUNWAY_K8S_KUBECONFIG", "RUNWAY_K8S_NAMESPACE", "RUNWAY_K8S_REGISTRY", "RUNWAY_K8S_HOST_IP")
	var registrations atomic.Int64
	e := newEnv(t)
	cpi, err := cpibin.Path("kubernetes")
	must(t, err)
	e.cpiPath = cpi
	b, _ := json.Marshal(map[string]any{"driver": "kubernetes", "state_dir": filepath.Join(e.dir, "cpi-state"), "kubernetes": map[string]any{
		"kubeconfig": env[0], "namespace": env[1], "delete_grace_seconds": 1, "wait_timeout_seconds": 60,
		"owner":    fmt.Sprintf("e2e-%d", os.Getpid()),
		"registry": map[string]any{"repository": env[2], "insecure": true}}})
	must(t, os.WriteFile(e.cpiCfg, b, 0o600))

	// The runner image: busybox and a static test runner.
	runner := bins.testrunner // static: cpibin.Build
	e.runnerPath = "/bin/testrunner"
	e.stemcell = filepath.Join(e.dir, "runner-rootfs.tgz")
	must(t, rootfs.Write(e.stemcell, map[string]string{e.runnerPath: runner}))

	// Runners reach the forge at the host's address on the cluster's link.
	ln, err := net.Listen("tcp4", net.JoinHostPort(env[3], "0"))
	must(t, err)
	e.serveRunners(ln, &registrations)
	e.forgeYML = fmt.Sprintf(`
  - name: gitea
    type: gitea
    url: %s
    runner_url: http://%s
    token_file: %s
    webhook_secret_file: %s
    poll_interval: 300ms`, e.gitea.URL, ln.Addr(), filepath.Join(e.dir, "api-token"), filepath.Join(e.dir, "hook-secret"))

	e.threeJobsThrough("the cluster's link", &registrations, 90*time.Second)
	resp, err := e.cpi().Call(context.Background(), "info", "observe")
	must(t, err)
	if !strings.Contains(string(resp.Result), "warden-tar") {
		t.Errorf("info with a registry: %s; want warden-tar among the formats", resp.Result)
	}
}
