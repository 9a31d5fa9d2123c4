package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/runway-cpi/runway/src/testkit/pgtest"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

const root = "../../.."

// cluster is the dev cluster with Runway installed in a namespace of the
// test's own.
type cluster struct {
	t          testing.TB
	kube       kubernetes.Interface
	dyn        dynamic.Interface
	kubeconfig string
	ns         string
	release    string
	hostIP     string
	registry   string // host:port
	runnerImg  string // the runner image (scripts/image -runner), by digest
	// pods: every runner pod seen made (by name), from a watch.
	podsMu  sync.Mutex
	pods    map[string]bool
	running map[string]time.Time // when each was first seen Running (or done)
}

func newCluster(t testing.TB) *cluster {
	c := clusterFor(t, "rw")
	if err := c.makeNamespace(c.ns); err != nil {
		t.Fatal(err)
	}
	return c
}

// clusterFor is the dev cluster with a namespace name of the test's own
// for release (made by the caller; removed at the end).
func clusterFor(t testing.TB, release string) *cluster {
	env := testenv.Need(t, "scripts/k8s-dev start, then its $K8S_DEV_DIR/env", "RUNWAY_K8S_ADMIN_KUBECONFIG",
		"RUNWAY_K8S_REGISTRY", "RUNWAY_K8S_HOST_IP", "RUNWAY_K8S_API")
	rc, err := clientcmd.BuildConfigFromFlags("", env[0])
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 3)
	rand.Read(b)
	c := &cluster{t: t, kube: kubernetes.NewForConfigOrDie(rc), dyn: dynamic.NewForConfigOrDie(rc), kubeconfig: env[0],
		ns: "runway-e2e-" + hex.EncodeToString(b), release: release, hostIP: env[2], registry: strings.SplitN(env[1], "/", 2)[0],
		pods: map[string]bool{}, running: map[string]time.Time{}}
	t.Cleanup(c.cleanup)
	return c
}

// makeNamespace makes a namespace enforcing the restricted standard,
// removed at the end.
func (c *cluster) makeNamespace(ns string) error {
	_, err := c.kube.CoreV1().Namespaces().Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns,
		Labels: map[string]string{"pod-security.kubernetes.io/enforce": "restricted", "pod-security.kubernetes.io/enforce-version": "latest"}}},
		metav1.CreateOptions{})
	if err == nil && ns != c.ns {
		c.t.Cleanup(func() { c.kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })
	}
	return err
}

// fullname is the chart's name for its objects (its Lease, Service).
func (c *cluster) fullname() string {
	if strings.Contains(c.release, "runway") {
		return c.release
	}
	return c.release + "-runway"
}

// cleanup uninstalls and removes the namespace (objects still holding
// Runway's finalizer are released first: the controller is gone).
func (c *cluster) cleanup() {
	ctx := context.Background()
	c.helm("uninstall", c.release, "-n", c.ns, "--wait", "--timeout", "60s")
	for _, gvr := range []schema.GroupVersionResource{seedGVR, forgeGVR, groupGVR} {
		list, _ := c.dyn.Resource(gvr).Namespace("").List(ctx, metav1.ListOptions{})
		if list == nil {
			continue
		}
		for _, u := range list.Items {
			if strings.HasPrefix(u.GetNamespace(), c.ns) {
				c.dyn.Resource(gvr).Namespace(u.GetNamespace()).Patch(ctx, u.GetName(), "application/merge-patch+json",
					[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
			}
		}
	}
	c.kube.CoreV1().Namespaces().Delete(ctx, c.ns, metav1.DeleteOptions{})
}

var (
	seedGVR  = schema.GroupVersionResource{Group: "gitea.bpg.pw", Version: "v1alpha1", Resource: "runnergroups"}
	forgeGVR = schema.GroupVersionResource{Group: "runway.io", Version: "v1alpha1", Resource: "forges"}
	groupGVR = schema.GroupVersionResource{Group: "runway.io", Version: "v1alpha1", Resource: "runnergroups"}
)

func (c *cluster) helm(args ...string) (string, error) {
	cmd := exec.Command(root+"/scripts/helm", append(args, "--kubeconfig", c.kubeconfig)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// pushRunwayImage builds Runway's image (scripts/image) and pushes it to
// the cluster's registry; it answers its reference by digest.
func (c *cluster) pushRunwayImage() string {
	repo := c.registry + "/runway/runway"
	out, err := exec.Command(root+"/scripts/image", "-push", repo+":e2e").Output()
	if err != nil {
		c.t.Fatalf("scripts/image: %v", err)
	}
	return repo + "@" + strings.TrimSpace(string(out))
}

// runnerCmd is the runner image's runner (scripts/image -runner).
const runnerCmd = "/usr/local/bin/runner"

// pushRunnerImage builds the runner image (scripts/image -runner) and
// pushes it to the cluster's registry.
func (c *cluster) pushRunnerImage() {
	out, err := exec.Command(root+"/scripts/image", "-runner", "-push", c.registry+"/runway/runner:e2e").Output()
	if err != nil {
		c.t.Fatalf("scripts/image -runner: %v", err)
	}
	c.runnerImg = c.registry + "/runway/runner@" + strings.TrimSpace(string(out))
}

// serve serves h on the host's end of the cluster's link (port 0: any).
func (c *cluster) serve(port int, h http.Handler) string {
	ln, err := net.Listen("tcp4", net.JoinHostPort(c.hostIP, fmt.Sprint(port)))
	if err != nil {
		c.t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	c.t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// postgres makes a database of its own and a proxy to it on the
// cluster's link; it answers the DSN pods use.
func (c *cluster) postgres() string {
	dsn := pgtest.Database(c.t)
	u, err := url.Parse(dsn)
	if err != nil {
		c.t.Fatal(err)
	}
	ln, err := net.Listen("tcp4", net.JoinHostPort(c.hostIP, "0"))
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { ln.Close() })
	target := u.Host
	go func() {
		for {
			down, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer down.Close()
				up, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer up.Close()
				// Either side closing ends both (a killed pod's session
				// ends at once, and its advisory locks with it).
				done := make(chan struct{}, 2)
				go func() { io.Copy(up, down); done <- struct{}{} }()
				go func() { io.Copy(down, up); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	u.Host = ln.Addr().String()
	return u.String()
}

// install installs the chart with Runway's image and the given values.
func (c *cluster) install(image, dsn string, values ...string) {
	ctx := context.Background()
	_, err := c.kube.CoreV1().Secrets(c.ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "runway-postgres"},
		StringData: map[string]string{"dsn": dsn}}, metav1.CreateOptions{})
	if err != nil {
		c.t.Fatal(err)
	}
	repo, digest, _ := strings.Cut(image, "@")
	api, _ := url.Parse(os.Getenv("RUNWAY_K8S_API"))
	args := []string{"install", c.release, "config/helm/runway" /* scripts/helm runs from the root */, "-n", c.ns, "--wait", "--timeout", "180s",
		"--set", "image.repository=" + repo, "--set", "image.digest=" + digest,
		"--set", "kubernetesAPI.host=" + api.Hostname(), "--set-string", "kubernetesAPI.port=" + api.Port(),
		"--set", "seed.runnerImage=" + c.runnerImg, "--set", "seed.runnerCommand=" + runnerCmd, "--set", "seed.runnerArgs=null",
		"--set", "seed.pollInterval=500ms", "--set", "runners.deleteGraceSeconds=1", "--set", "runners.waitTimeoutSeconds=60",
		"--set", "logLevel=debug", "--set", "sweepInterval=2s"}
	for _, v := range values {
		args = append(args, "--set", v)
	}
	if out, err := c.helm(args...); err != nil {
		c.t.Fatalf("helm install: %v\n%s\n%s", err, out, c.logs())
	}
}

// logs is every Runway pod's log (for a failure's message).
func (c *cluster) logs() string {
	var b strings.Builder
	pods, _ := c.kube.CoreV1().Pods(c.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=runway"})
	if pods == nil {
		return ""
	}
	for _, p := range pods.Items {
		raw, _ := c.kube.CoreV1().Pods(c.ns).GetLogs(p.Name, &corev1.PodLogOptions{}).DoRaw(context.Background())
		fmt.Fprintf(&b, "=== %s (%s)\n%s\n", p.Name, p.Status.Phase, raw)
	}
	return b.String()
}

// watchRunnerPods records every runner pod made (the driver's owner
// label).
func (c *cluster) watchRunnerPods() {
	ctx, cancel := context.WithCancel(context.Background())
	c.t.Cleanup(cancel)
	w, err := c.kube.CoreV1().Pods(c.ns).Watch(ctx, metav1.ListOptions{LabelSelector: "runway.io/owner=runway-" + c.release})
	if err != nil {
		c.t.Fatal(err)
	}
	go func() {
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			c.podsMu.Lock()
			if ev.Type == watch.Added {
				c.pods[p.Name] = true
			}
			// Running, or already done (a runner that takes its job at once
			// can end before a watch sees it Running).
			if _, seen := c.running[p.Name]; !seen && (p.Status.Phase == corev1.PodRunning || p.Status.Phase == corev1.PodSucceeded) {
				c.running[p.Name] = time.Now()
			}
			c.podsMu.Unlock()
		}
	}()
}

func (c *cluster) podsMade() int {
	c.podsMu.Lock()
	defer c.podsMu.Unlock()
	return len(c.pods)
}

// runnerPods counts the runner pods there now.
func (c *cluster) runnerPods() int {
	pods, err := c.kube.CoreV1().Pods(c.ns).List(context.Background(), metav1.ListOptions{LabelSelector: "runway.io/owner=runway-" + c.release})
	if err != nil {
		return -1
	}
	return len(pods.Items)
}

// apply creates objects (YAML) in the namespace, unedited.
func (c *cluster) apply(objs []*unstructured.Unstructured) { c.applyIn(c.ns, objs) }

// applyIn creates objects (YAML) in namespace ns, unedited.
func (c *cluster) applyIn(ns string, objs []*unstructured.Unstructured) {
	for _, u := range objs {
		gvk := u.GroupVersionKind()
		gvr := map[string]schema.GroupVersionResource{"Secret": {Version: "v1", Resource: "secrets"}, "RunnerGroup.gitea.bpg.pw": seedGVR,
			"Forge.runway.io": forgeGVR, "RunnerGroup.runway.io": groupGVR}[strings.TrimSuffix(gvk.Kind+"."+gvk.Group, ".")]
		if _, err := c.dyn.Resource(gvr).Namespace(ns).Create(context.Background(), u.DeepCopy(), metav1.CreateOptions{}); err != nil {
			c.t.Fatalf("creating %s %s: %v", gvk.Kind, u.GetName(), err)
		}
	}
}

// leader is the Lease's holder.
func (c *cluster) leader() string {
	l, err := c.kube.CoordinationV1().Leases(c.ns).Get(context.Background(), c.fullname(), metav1.GetOptions{})
	if err != nil || l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// waitFor polls cond every 100 ms until it holds or d passes.
func (c *cluster) waitFor(d time.Duration, what string, cond func() bool) {
	c.t.Helper()
	for end := time.Now().Add(d); !cond(); time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			c.t.Fatalf("not within %s: %s\n%s", d, what, c.logs())
		}
	}
}

// counting wraps a forge contract server's handler, counting runner
// registrations (gitea-runner's Register RPC).
func counting(h http.Handler, n *atomic.Int64) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/Register") {
			n.Add(1)
		}
		h.ServeHTTP(w, r)
	})
}
