package kubernetes

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/runway-cpi/runway/src/driver"
)

// snapshot_disk makes a VolumeSnapshot of the disk's claim, labelled as
// the driver's and with the Director's metadata; delete_snapshot deletes
// it (twice is fine). Where the cluster serves no snapshot API, both are
// NotImplemented. The dev cluster serves the API only (no controller, no
// CSI driver): no data is copied here.
func TestSnapshots(t *testing.T) {
	c := devCluster(t)
	d := newTestDriver(t, c, nil)
	ctx := context.Background()
	rc, err := clientcmd.BuildConfigFromFlags("", c.adminConfig)
	if err != nil {
		t.Fatal(err)
	}
	snaps := dynamic.NewForConfigOrDie(rc).Resource(snapshotGVR).Namespace(c.ns)

	disk, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 1024, CloudProps: driver.PropsOf(map[string]any{"storage_class": c.class})})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteDisk(ctx, disk)
	snap, err := d.SnapshotDisk(ctx, disk, map[string]string{"deployment": "dep", "director name": "my director"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := snaps.Get(ctx, snap, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("snapshot %s: %v", snap, err)
	}
	src, _, _ := unstructured.NestedString(got.Object, "spec", "source", "persistentVolumeClaimName")
	l, a := got.GetLabels(), got.GetAnnotations()
	if src != disk || l[labelOwner] != defaultOwner || l[labelDisk] != disk || l[labelPrefix+"deployment"] != "dep" ||
		tagsOf(a)["director name"] != "my director" {
		t.Errorf("snapshot %s: source %q, labels %v, annotations %v", snap, src, l, a)
	}
	if _, err := d.SnapshotDisk(ctx, "disk-00000000-0000-4000-8000-000000000009", nil); !errors.Is(err, driver.ErrDiskNotFound) {
		t.Errorf("snapshot of an unknown disk: %v; want ErrDiskNotFound", err)
	}
	if err := d.DeleteSnapshot(ctx, "../"+snap); !errors.Is(err, driver.ErrInvalidInput) {
		t.Errorf("delete_snapshot of a path: %v; want ErrInvalidInput", err)
	}
	if err := d.DeleteSnapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if _, err := snaps.Get(ctx, snap, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("snapshot after delete_snapshot: %v; want NotFound", err)
	}
	if err := d.DeleteSnapshot(ctx, snap); err != nil {
		t.Errorf("delete_snapshot again: %v; want nil", err)
	}

	// The API withdrawn (the version no longer served), then restored.
	served := func(on bool) {
		t.Helper()
		kubectl := filepath.Join(filepath.Dir(c.adminConfig), "bin-"+"v1.37.2-etcd-v3.7.0", "kubectl")
		patch := `[{"op": "replace", "path": "/spec/versions/0/served", "value": false}]`
		if on {
			patch = `[{"op": "replace", "path": "/spec/versions/0/served", "value": true}]`
		}
		if out, err := exec.Command(kubectl, "--kubeconfig", c.adminConfig, "patch", "crd", "volumesnapshots.snapshot.storage.k8s.io",
			"--type", "json", "-p", patch).CombinedOutput(); err != nil {
			t.Fatalf("kubectl patch: %v: %s", err, out)
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			_, err := c.admin.Discovery().ServerResourcesForGroupVersion(snapshotGVR.GroupVersion().String())
			if (err == nil) == on {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("discovery did not follow served=%v: %v", on, err)
			}
		}
	}
	served(false)
	defer served(true)
	if _, err := d.SnapshotDisk(ctx, disk, nil); !errors.Is(err, driver.ErrNotImplemented) {
		t.Errorf("snapshot_disk without the API: %v; want ErrNotImplemented", err)
	}
	if err := d.DeleteSnapshot(ctx, snap); !errors.Is(err, driver.ErrNotImplemented) {
		t.Errorf("delete_snapshot without the API: %v; want ErrNotImplemented", err)
	}
}
