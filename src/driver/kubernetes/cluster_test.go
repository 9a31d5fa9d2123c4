package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	k8s "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/drivertest"
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/retry"
	"github.com/runway-cpi/runway/src/testkit/cpibin"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// cluster is the dev cluster of scripts/k8s-dev: the driver's identity
// (the documented Role only), an admin client for checks, the test image.
type cluster struct {
	kubeconfig, adminConfig, ns, image, class, fixedClass string
	admin                                                 k8s.Interface
}

func devCluster(t testing.TB) cluster {
	t.Helper()
	env := testenv.Need(t, "scripts/k8s-dev start, then its $K8S_DEV_DIR/env",
		"RUNWAY_K8S_KUBECONFIG", "RUNWAY_K8S_ADMIN_KUBECONFIG", "RUNWAY_K8S_NAMESPACE", "RUNWAY_K8S_TEST_IMAGE",
		"RUNWAY_K8S_STORAGE_CLASS", "RUNWAY_K8S_FIXED_STORAGE_CLASS")
	c := cluster{kubeconfig: env[0], adminConfig: env[1], ns: env[2], image: env[3], class: env[4], fixedClass: env[5]}
	rc, err := clientcmd.BuildConfigFromFlags("", c.adminConfig)
	if err != nil {
		t.Fatal(err)
	}
	c.admin = k8s.NewForConfigOrDie(rc)
	return c
}

func (c cluster) section(extra map[string]any) json.RawMessage {
	m := map[string]any{"kubeconfig": c.kubeconfig, "namespace": c.ns, "wait_timeout_seconds": 60, "delete_grace_seconds": 1}
	for k, v := range extra {
		m[k] = v
	}
	b, _ := json.Marshal(m)
	return b
}

// watchPod reads the pod named cid and watches it from that version on
// (until the test ends).
func (c cluster) watchPod(t *testing.T, ctx context.Context, cid string) (*corev1.Pod, watch.Interface) {
	t.Helper()
	p, err := c.admin.CoreV1().Pods(c.ns).Get(ctx, cid, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.admin.CoreV1().Pods(c.ns).Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + cid, ResourceVersion: p.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return p, w
}

func newTestDriver(t testing.TB, c cluster, extra map[string]any) *Driver {
	t.Helper()
	log := logging.Discard()
	lk, err := lock.New(filepath.Join(t.TempDir(), "locks"), time.Minute, log)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(c.section(extra), lk, log, retry.Policy{Base: 50 * time.Millisecond, MaxSleep: time.Second, Budget: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// cpiCaller is bin/cpi as the Director runs it, with the dev cluster's
// section (extra keys over it) in its config file.
func cpiCaller(t *testing.T, c cluster, extra map[string]any) cpibin.Caller {
	t.Helper()
	dir := t.TempDir()
	var section map[string]any
	_ = json.Unmarshal(c.section(extra), &section)
	return cpibin.Configured(t, dir, "kubernetes", map[string]any{"driver": "kubernetes", "state_dir": filepath.Join(dir, "state"), "kubernetes": section})
}

// in is c with another namespace.
func (c cluster) in(ns string) cluster { c.ns = ns; return c }

// driverWithStemcell is a driver on c and a light stemcell of the test
// image, c checked to be left empty at the test's end.
func (c cluster) driverWithStemcell(t *testing.T) (*Driver, string) {
	t.Cleanup(func() { assertNoneLeft(t, c) })
	d := newTestDriver(t, c, nil)
	sc, err := d.CreateStemcell(context.Background(), driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"image": c.image})})
	if err != nil {
		t.Fatal(err)
	}
	return d, sc
}

// agentNamespace is the dev cluster's privileged namespace (agent pods
// run there), checked to be left empty at the test's end.
func (c cluster) agentNamespace(t *testing.T) cluster {
	ns := testenv.Need(t, "scripts/k8s-dev start (its privileged namespace)", "RUNWAY_K8S_AGENT_NAMESPACE")[0]
	ac := c.in(ns)
	t.Cleanup(func() { assertNoneLeft(t, ac) })
	return ac
}

// assertNoneLeft fails t for any pod, secret or claim of the driver left
// in the namespace.
func assertNoneLeft(t *testing.T, c cluster) {
	t.Helper()
	ctx := context.Background()
	sel := metav1.ListOptions{LabelSelector: labelOwner + "=" + defaultOwner}
	pods, err := c.admin.CoreV1().Pods(c.ns).List(ctx, sel)
	if err != nil {
		t.Fatal(err)
	}
	secs, _ := c.admin.CoreV1().Secrets(c.ns).List(ctx, sel)
	pvcs, _ := c.admin.CoreV1().PersistentVolumeClaims(c.ns).List(ctx, sel)
	for _, p := range pods.Items {
		t.Errorf("left behind: pod %s (%s)", p.Name, p.Status.Phase)
	}
	for _, s := range secs.Items {
		t.Errorf("left behind: secret %s", s.Name)
	}
	for _, p := range pvcs.Items {
		t.Errorf("left behind: claim %s", p.Name)
	}
}

func (c cluster) fixture(t *testing.T) drivertest.Fixture {
	return drivertest.Fixture{
		New: func(t *testing.T) driver.Driver { d := newTestDriver(t, c, nil); return d },
		StemcellImage: func(t *testing.T) (string, driver.Props) {
			return "", driver.PropsOf(map[string]any{"name": "bosh-kubernetes-busybox", "version": "1", "image": c.image})
		},
		VMProps:     driver.PropsOf(map[string]any{"command": []string{"sleep", "3600"}, "cpu": 1, "ram": 64}),
		Networks:    driver.Networks{"default": {Type: "dynamic", CloudProperties: driver.PropsOf(map[string]any{})}},
		DiskProps:   driver.PropsOf(map[string]any{"storage_class": c.class}),
		UnknownVM:   "vm-00000000-0000-4000-8000-000000000001",
		UnknownDisk: "disk-00000000-0000-4000-8000-000000000002",
	}
}

// The conformance suite on a real kubelet, as the documented Role, in a
// namespace that enforces the restricted Pod Security Standard.
func TestConformance(t *testing.T) {
	c := devCluster(t)
	t.Cleanup(func() { assertNoneLeft(t, c) })
	drivertest.Run(t, c.fixture(t))
}

// The driver's identity is the Role, not an administrator.
func TestRunsAsTheDocumentedRoleOnly(t *testing.T) {
	c := devCluster(t)
	d := newTestDriver(t, c, nil)
	ctx := context.Background()
	if _, err := d.cs.CoreV1().Pods("default").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing pods in another namespace: %v; want forbidden", err)
	}
	if _, err := d.cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("listing nodes: %v; want forbidden", err)
	}
	ns, err := c.admin.CoreV1().Namespaces().Get(ctx, c.ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if ns.Labels["pod-security.kubernetes.io/enforce"] != "restricted" {
		t.Errorf("namespace %s enforces %q; want restricted", c.ns, ns.Labels["pod-security.kubernetes.io/enforce"])
	}
}

// A pod that cannot come up is a typed create_vm error with Kubernetes'
// reason, and leaves nothing.
func TestPodsThatCannotRunAreTypedErrors(t *testing.T) {
	c := devCluster(t)
	d, sc := c.driverWithStemcell(t)
	ctx := context.Background()
	missing, err := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"image": "127.0.0.1:9/runway/none:1"})})
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		sc     string
		props  map[string]any
		reason []string
	}{
		"image that cannot be pulled": {missing, map[string]any{}, []string{"ErrImagePull", "ImagePullBackOff"}},
		"unschedulable":               {sc, map[string]any{"cpu": defaultMaxCPU, "command": []string{"sleep", "60"}}, []string{"Unschedulable"}},
		"process that cannot start":   {sc, map[string]any{"command": []string{"/no/such/program"}}, []string{"Terminated", "Failed", "RunContainerError", "CreateContainerError"}},
	} {
		t.Run(name, func(t *testing.T) {
			vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "typed", StemcellCID: tc.sc, CloudProps: driver.PropsOf(tc.props)})
			if err == nil {
				d.DeleteVM(ctx, vm.CID)
			}
			var ce *driver.CreationError
			var pf *podFailure
			if !errors.As(err, &ce) || !errors.As(err, &pf) {
				t.Fatalf("create_vm: %v; want a CreationError carrying the pod's reason", err)
			}
			if !strings.Contains(strings.Join(tc.reason, " "), pf.Reason) {
				t.Errorf("reason %q (%v); want one of %v", pf.Reason, err, tc.reason)
			}
		})
	}
}

// Manual networks and heavy stemcells are refused by name.
func TestRefusedByName(t *testing.T) {
	c := devCluster(t)
	d := newTestDriver(t, c, nil)
	ctx := context.Background()
	_, err := d.CreateStemcell(ctx, driver.StemcellSpec{ImagePath: "/tmp/image", CloudProps: driver.PropsOf(map[string]any{"name": "bosh-warden"})})
	if !errors.Is(err, driver.ErrInvalidInput) || !strings.Contains(err.Error(), "cloud_properties.image") {
		t.Errorf("heavy stemcell: %v; want ErrInvalidInput naming cloud_properties.image", err)
	}
	sc, _ := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"image": c.image})})
	_, err = d.CreateVM(ctx, driver.VMSpec{AgentID: "m", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{}),
		Networks: driver.Networks{"private": {Type: "manual", IP: "10.0.0.5"}}})
	if !errors.Is(err, driver.ErrInvalidInput) || !strings.Contains(err.Error(), "networks.private") {
		t.Errorf("manual network: %v; want ErrInvalidInput naming networks.private", err)
	}
	for _, cid := range []string{"../../etc", "vm-x/../../y", "img-!!"} {
		if _, err := d.HasVM(ctx, cid); !errors.Is(err, driver.ErrInvalidInput) {
			t.Errorf("has_vm %q: %v; want ErrInvalidInput", cid, err)
		}
	}
}

// Attaching and detaching make the pod again: what the VM wrote on its
// disk stays, and the disk keeps its data through a reboot too.
func TestPodRecreationKeepsDiskData(t *testing.T) {
	c := devCluster(t)
	d, sc := c.driverWithStemcell(t)
	ctx := context.Background()
	// Every start appends a line to each disk it finds.
	boot := `for d in "$RUNWAY_DISKS_DIR"/*; do [ -d "$d" ] && echo "$RUNWAY_VM_CID" >>"$d/boots"; done; exec sleep 3600`
	vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "disky", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"command": boot})})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteVM(ctx, vm.CID)
	disk, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 512, CloudProps: driver.PropsOf(map[string]any{"storage_class": c.class})})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteDisk(ctx, disk)
	if _, err := d.AttachDisk(ctx, vm.CID, disk); err != nil {
		t.Fatal(err)
	}
	if err := d.RebootVM(ctx, vm.CID); err != nil {
		t.Fatal(err)
	}
	if got := c.exec(t, vm.CID, "cat", "/warden-cpi-dev/"+disk+"/boots"); got != vm.CID+"\n"+vm.CID+"\n" {
		t.Fatalf("boots on the disk after attach and reboot = %q; want two lines", got)
	}
	if err := d.DetachDisk(ctx, vm.CID, disk); err != nil {
		t.Fatal(err)
	}
	if err := d.DeleteVM(ctx, vm.CID); err != nil {
		t.Fatal(err)
	}
	vm2, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "disky", StemcellCID: sc, DiskCIDs: []string{disk},
		CloudProps: driver.PropsOf(map[string]any{"command": boot})})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteVM(ctx, vm2.CID)
	if got := c.exec(t, vm2.CID, "cat", "/warden-cpi-dev/"+disk+"/boots"); got != strings.Repeat(vm.CID+"\n", 2)+vm2.CID+"\n" {
		t.Fatalf("boots on the disk on another VM = %q", got)
	}
	if err := d.ResizeDisk(ctx, disk, 1024); err != nil {
		t.Errorf("resize in an expandable class: %v", err)
	}
	fixed, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 512, CloudProps: driver.PropsOf(map[string]any{"storage_class": c.fixedClass})})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteDisk(ctx, fixed)
	if err := d.ResizeDisk(ctx, fixed, 1024); !errors.Is(err, driver.ErrNotSupported) || !strings.Contains(err.Error(), c.fixedClass) {
		t.Errorf("resize in a class without expansion: %v; want ErrNotSupported naming %s", err, c.fixedClass)
	}
	if err := d.DeleteDisk(ctx, disk); !errors.Is(err, driver.ErrInvalidInput) {
		t.Errorf("delete_disk of an attached disk: %v; want it refused", err)
	}
	d.DeleteVM(ctx, vm2.CID)
}

// exec runs a command in a VM's container as the administrator (the
// driver's Role has no pods/exec).
func (c cluster) exec(t *testing.T, pod string, argv ...string) string {
	t.Helper()
	kubectl := filepath.Join(filepath.Dir(c.adminConfig), "bin-"+"v1.37.2-etcd-v3.7.0", "kubectl")
	out, err := exec.Command(kubectl, append([]string{"--kubeconfig", c.adminConfig, "-n", c.ns, "exec", pod, "--"}, argv...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl exec %s %v: %v: %s", pod, argv, err, out)
	}
	return string(out)
}

// logsUntil reads a VM's log as the administrator until it holds want
// (a minute at most).
func (c cluster) logsUntil(t *testing.T, pod, want string) string {
	t.Helper()
	var out []byte
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		out, _ = c.admin.CoreV1().Pods(c.ns).GetLogs(pod, &corev1.PodLogOptions{}).DoRaw(context.Background())
		if strings.Contains(string(out), want) {
			return string(out)
		}
	}
	t.Fatalf("pod %s never logged %q:\n%s", pod, want, out)
	return ""
}

// A recreated pod never gets the Secret the old pod's deletion is taking
// away: the garbage collector may delete that one late (under load it
// did, after the reboot had handed it to the new pod). Here a finalizer
// holds the old Secret in deletion; no new pod may be made until it is
// really gone, and then the new pod owns a new Secret.
func TestRebootWaitsForTheOldSettingsToGo(t *testing.T) {
	c := devCluster(t)
	d, sc := c.driverWithStemcell(t)
	ctx := context.Background()
	vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "held", StemcellCID: sc,
		CloudProps: driver.PropsOf(map[string]any{"command": []string{"sleep", "3600"}}), AgentSettings: []byte(`{"agent_id":"held"}`)})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteVM(ctx, vm.CID)
	secrets := c.admin.CoreV1().Secrets(c.ns)
	const hold = "runway.io/test-hold"
	old, err := secrets.Patch(ctx, settingsName(vm.CID), types.MergePatchType, []byte(`{"metadata":{"finalizers":["`+hold+`"]}}`), metav1.PatchOptions{})
	if err != nil {
		t.Fatal(err)
	}
	release := func() {
		secrets.Patch(ctx, old.Name, types.JSONPatchType, []byte(`[{"op":"remove","path":"/metadata/finalizers"}]`), metav1.PatchOptions{})
	}
	defer release()
	oldPod, pw := c.watchPod(t, ctx, vm.CID)
	sw, err := secrets.Watch(ctx, metav1.ListOptions{FieldSelector: "metadata.name=" + old.Name, ResourceVersion: old.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Stop()

	done := make(chan error, 1)
	go func() { done <- d.RebootVM(ctx, vm.CID) }()
	// Until the old Secret is being deleted and the old pod is gone, then
	// for 3 s more (a new pod came within milliseconds when this broke):
	// no pod of another UID may appear.
	var terminating, podGone bool
	var window <-chan time.Time // opens once both are seen
	timeout := time.After(time.Minute)
held:
	for {
		select {
		case ev := <-sw.ResultChan():
			if s, ok := ev.Object.(*corev1.Secret); ok && s.UID == old.UID && s.DeletionTimestamp != nil {
				terminating = true
			}
		case ev := <-pw.ResultChan():
			p, ok := ev.Object.(*corev1.Pod)
			if ok && p.UID != oldPod.UID {
				t.Fatalf("a new pod was made while the old Secret still existed (its deletion seen: %v)", terminating)
			}
			podGone = podGone || (ok && ev.Type == watch.Deleted)
		case err := <-done:
			t.Fatalf("reboot_vm returned while the old Secret was held: %v", err)
		case <-timeout:
			t.Fatalf("the old Secret never went into deletion (%v) or the old pod never went (%v)", terminating, podGone)
		case <-window:
			break held
		}
		if terminating && podGone && window == nil {
			window = time.After(3 * time.Second)
		}
	}
	release()
	if err := <-done; err != nil {
		t.Fatalf("reboot_vm after the old Secret went: %v", err)
	}
	pod, err := c.admin.CoreV1().Pods(c.ns).Get(ctx, vm.CID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec, err := secrets.Get(ctx, old.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the VM's settings after the reboot: %v", err)
	}
	if sec.UID == old.UID || len(sec.OwnerReferences) != 1 || sec.OwnerReferences[0].UID != pod.UID {
		t.Fatalf("settings after the reboot: uid %s (old %s), owners %+v; want a new Secret owned by pod %s", sec.UID, old.UID, sec.OwnerReferences, pod.UID)
	}
	if pod.Status.Phase != corev1.PodRunning {
		t.Fatalf("pod after the reboot: %s", pod.Status.Phase)
	}
}
