package kubernetes

import (
	"context"
	"fmt"
	"slices"

	"github.com/google/uuid"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/runway-cpi/runway/src/driver"
)

// The CSI snapshot API (external-snapshotter's CRDs): served where a
// cluster has them installed, and then only.
var snapshotGVR = schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"}

const (
	snapshotPrefix = "snap-"
	labelDisk      = "runway.io/disk"
)

// snapshotsServed says whether the cluster serves VolumeSnapshots.
func (d *Driver) snapshotsServed(ctx context.Context) error {
	gv := snapshotGVR.GroupVersion().String()
	if d.dyn == nil {
		return fmt.Errorf("%w: no client for %s", driver.ErrNotImplemented, gv)
	}
	var list *metav1.APIResourceList
	err := d.do(ctx, "discover "+gv, func(context.Context) error {
		var err error
		list, err = d.cs.Discovery().ServerResourcesForGroupVersion(gv)
		return err
	})
	if apierrors.IsNotFound(err) || (err == nil && !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool {
		return r.Name == snapshotGVR.Resource
	})) {
		return fmt.Errorf("%w: the cluster serves no VolumeSnapshot API (%s): snapshots need the CSI snapshot CRDs, its controller and a CSI driver that takes snapshots", driver.ErrNotImplemented, gv)
	}
	if err != nil {
		return d.apiErr("discover "+gv, err)
	}
	return nil
}

// SnapshotDisk implements driver.Snapshotter: a VolumeSnapshot of the
// disk's claim, labelled like everything the driver makes. The CSI driver
// cuts it asynchronously; its status is the cluster's to report.
func (d *Driver) SnapshotDisk(ctx context.Context, cid string, md map[string]string) (string, error) {
	if _, err := d.claim(ctx, cid); err != nil {
		return "", err
	}
	if err := d.snapshotsServed(ctx); err != nil {
		return "", err
	}
	name := snapshotPrefix + uuid.NewString()
	labels, annos := d.ownLabels("snapshot"), map[string]string{}
	labels[labelDisk] = cid
	tagMeta(md, labels, annos)
	spec := map[string]any{"source": map[string]any{"persistentVolumeClaimName": cid}}
	if d.cfg.SnapshotClass != "" {
		spec["volumeSnapshotClassName"] = d.cfg.SnapshotClass
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": snapshotGVR.GroupVersion().String(), "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": name, "labels": toAny(labels), "annotations": toAny(annos)},
		"spec":     spec,
	}}
	err := d.do(ctx, "create snapshot "+name, func(ctx context.Context) error {
		_, err := d.dyn.Resource(snapshotGVR).Namespace(d.ns).Create(ctx, obj, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) { // an earlier attempt's create answered late
			return nil
		}
		return err
	})
	if err != nil {
		return "", d.apiErr("create snapshot "+name, err)
	}
	d.Log.Info("snapshot requested", "snapshot", name, "disk", cid)
	return name, nil
}

// DeleteSnapshot implements driver.Snapshotter; one already gone is fine.
func (d *Driver) DeleteSnapshot(ctx context.Context, cid string) error {
	if _, err := validName("snapshot", snapshotPrefix, cid); err != nil {
		return err
	}
	if err := d.snapshotsServed(ctx); err != nil {
		return err
	}
	err := d.do(ctx, "delete snapshot "+cid, func(ctx context.Context) error {
		return d.dyn.Resource(snapshotGVR).Namespace(d.ns).Delete(ctx, cid, metav1.DeleteOptions{})
	})
	if err != nil && !apierrors.IsNotFound(err) {
		return d.apiErr("delete snapshot "+cid, err)
	}
	return nil
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
