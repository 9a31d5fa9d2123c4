package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/google/uuid"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/found"
)

const diskPrefix = "disk-"

func diskLock(cid string) string { return "kubernetes-disk-" + cid }

// CreateDisk implements driver.Driver: a PersistentVolumeClaim of the
// size, in the disk type's storage class (or the config's, or the
// cluster's default).
func (d *Driver) CreateDisk(ctx context.Context, spec driver.DiskSpec) (string, error) {
	p, err := decodeDiskProps(spec.CloudProps)
	if err != nil {
		return "", err
	}
	if spec.SizeMiB <= 0 {
		return "", driver.Invalid("size must be a positive number of MiB")
	}
	cid := diskPrefix + uuid.NewString()
	l := d.ownLabels("disk")
	annos := map[string]string{}
	tagMeta(spec.Tags, l, annos)
	class := p.StorageClass
	if class == "" {
		class = d.cfg.StorageClass
	}
	pvc := &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: cid, Labels: l, Annotations: annos},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources: corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{
				corev1.ResourceStorage: resource.MustParse(mib(spec.SizeMiB))}},
		},
	}
	if class != "" {
		pvc.Spec.StorageClassName = &class
	}
	if err := d.do(ctx, "create claim "+cid, func(ctx context.Context) error {
		_, err := d.cs.CoreV1().PersistentVolumeClaims(d.ns).Create(ctx, pvc, metav1.CreateOptions{})
		return err
	}); err != nil {
		return "", d.apiErr("create claim "+cid, err)
	}
	return cid, nil
}

func (d *Driver) claim(ctx context.Context, cid string) (*corev1.PersistentVolumeClaim, error) {
	if _, err := validName("disk", diskPrefix, cid); err != nil {
		return nil, err
	}
	var pvc *corev1.PersistentVolumeClaim
	err := d.do(ctx, "get claim "+cid, func(ctx context.Context) error {
		var err error
		pvc, err = d.cs.CoreV1().PersistentVolumeClaims(d.ns).Get(ctx, cid, metav1.GetOptions{})
		return err
	})
	if apierrors.IsNotFound(err) || (err == nil && (pvc.Labels[labelOwner] != d.cfg.Owner || pvc.DeletionTimestamp != nil)) {
		return nil, fmt.Errorf("claim %s: %w", cid, driver.ErrDiskNotFound)
	}
	if err != nil {
		return nil, d.apiErr("get claim "+cid, err)
	}
	return pvc, nil
}

// HasDisk implements driver.Driver.
func (d *Driver) HasDisk(ctx context.Context, cid string) (bool, error) {
	_, err := d.claim(ctx, cid)
	return found.Answer(err, driver.ErrDiskNotFound)
}

// DeleteDisk implements driver.Driver. A claim still mounted by a pod is
// refused by name (Kubernetes would keep it until the pod goes).
func (d *Driver) DeleteDisk(ctx context.Context, cid string) error {
	if _, err := d.claim(ctx, cid); err != nil {
		return err
	}
	unlock, err := d.Locks.Lock(ctx, diskLock(cid))
	if err != nil {
		return err
	}
	defer unlock()
	if vm, err := d.holder(ctx, cid); err != nil {
		return err
	} else if vm != "" {
		return driver.Invalid("disk %s is attached to vm %s: detach it first", cid, vm)
	}
	err = d.do(ctx, "delete claim "+cid, func(ctx context.Context) error {
		return d.cs.CoreV1().PersistentVolumeClaims(d.ns).Delete(ctx, cid, metav1.DeleteOptions{})
	})
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("claim %s: %w", cid, driver.ErrDiskNotFound)
	}
	if err != nil {
		return d.apiErr("delete claim "+cid, err)
	}
	return d.waitClaimGone(ctx, cid)
}

// waitClaimGone watches until claim cid no longer exists: its protection
// finalizer is lifted once no pod mounts it.
func (d *Driver) waitClaimGone(ctx context.Context, cid string) error {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.waitTimeout())
	defer cancel()
	pvcs := d.cs.CoreV1().PersistentVolumeClaims(d.ns)
	lw := byName(cid, pvcs.List, pvcs.Watch)
	_, err := watchtools.UntilWithSync(ctx, lw, &corev1.PersistentVolumeClaim{},
		func(store cache.Store) (bool, error) { return len(store.List()) == 0, nil },
		func(ev watch.Event) (bool, error) { return ev.Type == watch.Deleted, nil })
	if err != nil {
		return fmt.Errorf("waiting for claim %s to go: %w", cid, err)
	}
	return nil
}

// holder is the driver's pod that mounts claim cid ("" for none): one
// list, the pods' volumes read from it.
func (d *Driver) holder(ctx context.Context, cid string) (string, error) {
	pods, err := d.ownPods(ctx)
	if err != nil {
		return "", err
	}
	for _, p := range pods {
		if p.DeletionTimestamp == nil && slices.Contains(claims(&p), cid) {
			return p.Name, nil
		}
	}
	return "", nil
}

// AttachDisk implements driver.Driver. Kubernetes mounts no volume into
// a running pod: the pod is made again with the claim mounted at the
// agent's disk path — the same CID, its settings and disks kept.
func (d *Driver) AttachDisk(ctx context.Context, vmCID, diskCID string) (any, error) {
	if _, err := d.claim(ctx, diskCID); err != nil {
		return nil, err
	}
	hint := path.Join(diskMountDir, diskCID)
	err := d.recreate(ctx, vmCID, func(p *corev1.Pod) error {
		if slices.Contains(claims(p), diskCID) {
			return errUnchanged
		}
		withDisk(p, diskCID)
		return nil
	})
	if errors.Is(err, errUnchanged) {
		return hint, nil
	}
	if err != nil {
		return nil, err
	}
	return hint, nil
}

// errUnchanged stops a recreate that has nothing to change.
var errUnchanged = errors.New("unchanged")

// DetachDisk implements driver.Driver: the pod is made again without it.
func (d *Driver) DetachDisk(ctx context.Context, vmCID, diskCID string) error {
	if _, err := d.claim(ctx, diskCID); err != nil {
		return err
	}
	err := d.recreate(ctx, vmCID, func(p *corev1.Pod) error {
		if !slices.Contains(claims(p), diskCID) {
			return fmt.Errorf("disk %s on vm %s: %w", diskCID, vmCID, driver.ErrDiskNotAttached)
		}
		p.Spec.Volumes = slices.DeleteFunc(p.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == diskCID })
		c := &p.Spec.Containers[0]
		c.VolumeMounts = slices.DeleteFunc(c.VolumeMounts, func(m corev1.VolumeMount) bool { return m.Name == diskCID })
		return nil
	})
	return err
}

// claims are the driver's disks a pod mounts.
func claims(p *corev1.Pod) []string {
	var out []string
	for _, v := range p.Spec.Volumes {
		if c := v.PersistentVolumeClaim; c != nil && strings.HasPrefix(c.ClaimName, diskPrefix) {
			out = append(out, c.ClaimName)
		}
	}
	return out
}

// GetDisks implements driver.Driver.
func (d *Driver) GetDisks(ctx context.Context, vmCID string) ([]string, error) {
	if _, err := validName("vm", vmPrefix, vmCID); err != nil {
		return nil, err
	}
	p, err := d.pod(ctx, vmCID)
	if err != nil {
		return nil, err
	}
	return claims(p), nil
}

// SetDiskMetadata implements driver.DiskMetadata.
func (d *Driver) SetDiskMetadata(ctx context.Context, cid string, md map[string]string) error {
	pvc, err := d.claim(ctx, cid)
	if err != nil {
		return err
	}
	err = d.patchMeta(ctx, "claim "+cid, pvc.Annotations, md, func(ctx context.Context, patch []byte) error {
		_, err := d.cs.CoreV1().PersistentVolumeClaims(d.ns).Patch(ctx, cid, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if errors.Is(err, driver.ErrVMNotFound) {
		return fmt.Errorf("claim %s: %w", cid, driver.ErrDiskNotFound)
	}
	return err
}

// ResizeDisk implements driver.DiskResizer where the claim's storage
// class allows expansion; Kubernetes refuses it otherwise, and that is a
// typed error naming the class.
func (d *Driver) ResizeDisk(ctx context.Context, cid string, sizeMiB int) error {
	pvc, err := d.claim(ctx, cid)
	if err != nil {
		return err
	}
	want := resource.MustParse(mib(sizeMiB))
	cur := pvc.Spec.Resources.Requests[corev1.ResourceStorage]
	switch want.Cmp(cur) {
	case 0:
		return nil
	case -1:
		return fmt.Errorf("%w: disk %s is %s: a claim cannot shrink (to %d MiB)", driver.ErrNotSupported, cid, cur.String(), sizeMiB)
	}
	patch := fmt.Appendf(nil, `{"spec":{"resources":{"requests":{"storage":%q}}}}`, want.String())
	err = d.do(ctx, "resize claim "+cid, func(ctx context.Context) error {
		_, err := d.cs.CoreV1().PersistentVolumeClaims(d.ns).Patch(ctx, cid, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
	if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
		class := "(default)"
		if pvc.Spec.StorageClassName != nil {
			class = *pvc.Spec.StorageClassName
		}
		return fmt.Errorf("%w: disk %s: storage class %s does not allow expansion: %v", driver.ErrNotSupported, cid, class, err)
	}
	if err != nil {
		return d.apiErr("resize claim "+cid, err)
	}
	return nil
}

// UpdateDisk implements driver.DiskResizer: the size only (a claim's
// class cannot change).
func (d *Driver) UpdateDisk(ctx context.Context, cid string, sizeMiB int, props driver.Props) (string, error) {
	p, err := decodeDiskProps(props)
	if err != nil {
		return "", err
	}
	pvc, err := d.claim(ctx, cid)
	if err != nil {
		return "", err
	}
	if p.StorageClass != "" && (pvc.Spec.StorageClassName == nil || *pvc.Spec.StorageClassName != p.StorageClass) {
		return "", fmt.Errorf("%w: disk %s: a claim's storage class cannot change", driver.ErrNotSupported, cid)
	}
	return cid, d.ResizeDisk(ctx, cid, sizeMiB)
}
