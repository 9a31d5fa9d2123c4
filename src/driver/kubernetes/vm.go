package kubernetes

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/google/uuid"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/found"
)

// Where a warden stemcell's agent reads what the CPI gives it (the same
// layout as the local driver's container mode), and where disks appear.
const (
	agentDir         = "/var/vcap/bosh"
	agentSettingsKey = "warden-cpi-agent-env.json"
	userDataJSONKey  = "warden-cpi-user-data.json"
	metadataJSONKey  = "warden-cpi-metadata.json"
	userDataKey      = "user-data" // a script: the VM's command when it has none
	diskMountDir     = "/warden-cpi-dev"
	containerName    = "vm"
	vmPrefix         = "vm-"
)

func settingsName(vm string) string { return vm + "-agent" }

// CreateVM implements driver.Driver: a Secret with the agent's settings,
// then the pod; Running is awaited on a watch. Anything made is removed
// again when the pod does not come up.
func (d *Driver) CreateVM(ctx context.Context, spec driver.VMSpec) (driver.VM, error) {
	p, err := decodeVMProps(spec.CloudProps, d.cfg)
	if err != nil {
		return driver.VM{}, err
	}
	image, err := stemcellImage(spec.StemcellCID)
	if err != nil {
		return driver.VM{}, err
	}
	for name, n := range spec.Networks {
		if n.Type != "dynamic" {
			return driver.VM{}, driver.Invalid("networks.%s: type %q: a pod's address is the cluster's choice, so only dynamic networks are taken", name, n.Type)
		}
	}
	cmd, err := p.command()
	if err != nil {
		return driver.VM{}, err
	}
	if err := p.takeUserData(spec.Env); err != nil {
		return driver.VM{}, err
	}
	if cmd == nil && p.UserData != "" {
		cmd = []string{"/bin/sh", path.Join(agentDir, userDataKey)}
		if strings.HasPrefix(p.UserData, "#!") {
			cmd = cmd[1:]
		}
	}
	cid := spec.Name
	if cid == "" {
		cid = vmPrefix + uuid.NewString()
	}
	if _, err := validName("vm", vmPrefix, cid); err != nil {
		return driver.VM{}, err
	}
	// Every disk passes attach_disk's check: a claim of this owner.
	var disks []string
	for _, dc := range spec.DiskCIDs {
		if _, err := d.claim(ctx, dc); err != nil {
			return driver.VM{}, err
		}
		disks = append(disks, dc)
	}
	unlock, err := d.Locks.Lock(ctx, vmLock(cid))
	if err != nil {
		return driver.VM{}, err
	}
	defer unlock()

	// The pod first, then its settings, owned by it: a create_vm killed
	// between the two leaves a pod that list_vms finds (waiting for its
	// Secret), never a Secret nothing lists; the garbage collector takes
	// the Secret with the pod.
	pod := d.podFor(cid, spec, p, image, cmd, disks)
	started := time.Now()
	made, err := d.createPod(ctx, pod)
	if err != nil {
		d.cleanupVM(cid)
		if p.BoshAgent && strings.Contains(err.Error(), podSecurityRefusal) {
			err = fmt.Errorf("cloud_properties.bosh_agent: namespace %s must admit privileged pods (the agent's capabilities): %w", d.ns, err)
		}
		return driver.VM{}, &driver.CreationError{Err: err}
	}
	if err := d.giveSettings(ctx, made, d.settingsSecret(cid, spec.AgentSettings, p.UserData)); err != nil {
		d.cleanupVM(cid)
		return driver.VM{}, &driver.CreationError{Err: err}
	}
	running, err := d.waitRunning(ctx, made)
	if err != nil {
		d.cleanupVM(cid)
		if noUserNamespaces(err) {
			return driver.VM{}, &driver.CreationError{Err: agentWithoutUserNamespace(err)}
		}
		return driver.VM{}, &driver.CreationError{Err: err, Retryable: true}
	}
	d.Log.Info("pod "+stateOf(running), "vm", cid, "node", running.Spec.NodeName, "took", time.Since(started).Round(time.Millisecond))
	nets := driver.Networks{}
	for name, n := range spec.Networks {
		n.IP = running.Status.PodIP
		nets[name] = n
	}
	return driver.VM{CID: cid, Networks: nets}, nil
}

func vmLock(cid string) string { return "kubernetes-vm-" + cid }

// lockVM checks cid and takes its lock: changes to one pod go one at a time.
func (d *Driver) lockVM(ctx context.Context, cid string) (func(), error) {
	if _, err := validName("vm", vmPrefix, cid); err != nil {
		return nil, err
	}
	return d.Locks.Lock(ctx, vmLock(cid))
}

func (d *Driver) createPod(ctx context.Context, pod *corev1.Pod) (*corev1.Pod, error) {
	var made *corev1.Pod
	err := d.do(ctx, "create pod "+pod.Name, func(ctx context.Context) error {
		var err error
		made, err = d.cs.CoreV1().Pods(d.ns).Create(ctx, pod, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) { // an earlier attempt's create answered late
			made, err = d.cs.CoreV1().Pods(d.ns).Get(ctx, pod.Name, metav1.GetOptions{})
		}
		return err
	})
	if err != nil {
		return nil, d.apiErr("create pod "+pod.Name, err)
	}
	return made, nil
}

// ownedBy makes an object a dependent of pod: deleted with it.
func ownedBy(pod *corev1.Pod) []metav1.OwnerReference {
	return []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: pod.Name, UID: pod.UID}}
}

// giveSettings creates a VM's settings Secret owned by its pod (deleted
// with it). One there already (an earlier attempt's, or left by an older
// Runway's reboot) is handed to the pod instead.
func (d *Driver) giveSettings(ctx context.Context, pod *corev1.Pod, sec *corev1.Secret) error {
	sec.OwnerReferences = ownedBy(pod)
	err := d.do(ctx, "create secret "+sec.Name, func(ctx context.Context) error {
		_, err := d.cs.CoreV1().Secrets(d.ns).Create(ctx, sec, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"ownerReferences": sec.OwnerReferences}})
			_, err = d.cs.CoreV1().Secrets(d.ns).Patch(ctx, sec.Name, types.MergePatchType, b, metav1.PatchOptions{})
		}
		return err
	})
	if err != nil {
		return d.apiErr("create secret "+sec.Name, err)
	}
	return nil
}

// cleanupVM removes what a failed create_vm made, on its own budget (the
// call's context may be the reason it failed).
func (d *Driver) cleanupVM(cid string) {
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.waitTimeout())
	defer cancel()
	if err := d.deletePod(ctx, cid); err != nil && !errors.Is(err, driver.ErrVMNotFound) {
		d.Log.Info("cleaning up a pod that did not start", "vm", cid, "err", err)
	}
	d.deleteSettings(ctx, cid)
}

// DeleteVM implements driver.Driver: the pod, with its grace period, then
// its settings. Waits until the pod is gone.
func (d *Driver) DeleteVM(ctx context.Context, cid string) error {
	unlock, err := d.lockVM(ctx, cid)
	if err != nil {
		return err
	}
	defer unlock()
	err = d.deletePod(ctx, cid)
	d.deleteSettings(ctx, cid)
	return err
}

func (d *Driver) deleteSettings(ctx context.Context, cid string) {
	err := d.do(ctx, "delete secret "+settingsName(cid), func(ctx context.Context) error {
		return d.cs.CoreV1().Secrets(d.ns).Delete(ctx, settingsName(cid), metav1.DeleteOptions{})
	})
	if err != nil && !apierrors.IsNotFound(err) {
		d.Log.Info("deleting a vm's settings", "vm", cid, "err", err)
	}
}

// removeSettings deletes exactly the Secret sec (by UID) and waits until
// it is gone: one held by a finalizer is still there after the delete.
// Polled, not watched: the Role may not list or watch secrets.
func (d *Driver) removeSettings(ctx context.Context, sec *corev1.Secret) error {
	secrets := d.cs.CoreV1().Secrets(d.ns)
	err := d.do(ctx, "delete secret "+sec.Name, func(ctx context.Context) error {
		return secrets.Delete(ctx, sec.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &sec.UID}})
	})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) { // gone, or already another object
		return d.apiErr("delete secret "+sec.Name, err)
	}
	err = wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, d.cfg.waitTimeout(), true, func(ctx context.Context) (bool, error) {
		var cur *corev1.Secret
		err := d.do(ctx, "get secret "+sec.Name, func(ctx context.Context) error {
			var err error
			cur, err = secrets.Get(ctx, sec.Name, metav1.GetOptions{})
			return err
		})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return err == nil && cur.UID != sec.UID, err
	})
	if err != nil {
		return fmt.Errorf("waiting for secret %s to go: %w", sec.Name, err)
	}
	return nil
}

// HasVM implements driver.Driver.
func (d *Driver) HasVM(ctx context.Context, cid string) (bool, error) {
	if _, err := validName("vm", vmPrefix, cid); err != nil {
		return false, err
	}
	_, err := d.pod(ctx, cid)
	return found.Answer(err, driver.ErrVMNotFound)
}

func (d *Driver) pod(ctx context.Context, cid string) (*corev1.Pod, error) {
	var pod *corev1.Pod
	err := d.do(ctx, "get pod "+cid, func(ctx context.Context) error {
		var err error
		pod, err = d.cs.CoreV1().Pods(d.ns).Get(ctx, cid, metav1.GetOptions{})
		return err
	})
	if apierrors.IsNotFound(err) || (err == nil && pod.Labels[labelOwner] != d.cfg.Owner) {
		return nil, fmt.Errorf("pod %s: %w", cid, driver.ErrVMNotFound)
	}
	if err != nil {
		return nil, d.apiErr("get pod "+cid, err)
	}
	return pod, nil
}

// RebootVM implements driver.Driver: Kubernetes restarts no pod in
// place, so the pod is made again from its recorded spec (same CID,
// disks, settings).
func (d *Driver) RebootVM(ctx context.Context, cid string) error {
	return d.recreate(ctx, cid, func(*corev1.Pod) error { return nil })
}

// recreate deletes pod cid and makes it again, changed by edit, then
// waits for it to run.
func (d *Driver) recreate(ctx context.Context, cid string, edit func(*corev1.Pod) error) error {
	unlock, err := d.lockVM(ctx, cid)
	if err != nil {
		return err
	}
	defer unlock()
	old, err := d.pod(ctx, cid)
	if err != nil {
		return err
	}
	next := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: old.Name, Labels: old.Labels, Annotations: old.Annotations},
		Spec: *old.Spec.DeepCopy()}
	next.Spec.NodeName = ""
	if isAgent(&next.Spec) {
		d.agentUsers(&next.Spec)
	}
	if err := edit(next); err != nil {
		return err
	}
	// The settings go with the old pod and are made again for the new one,
	// as create_vm makes them: killed in between, nothing is left that
	// list_vms cannot find.
	var sec *corev1.Secret
	err = d.do(ctx, "get secret "+settingsName(cid), func(ctx context.Context) error {
		var err error
		sec, err = d.cs.CoreV1().Secrets(d.ns).Get(ctx, settingsName(cid), metav1.GetOptions{})
		return err
	})
	if err != nil {
		return d.apiErr("get secret "+settingsName(cid), err)
	}
	if err := d.deletePod(ctx, cid); err != nil {
		return err
	}
	// The old Secret must be gone before the new one is made: left to the
	// garbage collector, its late deletion could take the new pod's
	// settings with it (seen under load: pods stuck without a Secret).
	if err := d.removeSettings(ctx, sec); err != nil {
		return err
	}
	made, err := d.createPod(ctx, next)
	if err != nil {
		return err
	}
	fresh := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: sec.Name, Labels: sec.Labels, Annotations: sec.Annotations},
		Data: sec.Data, Type: sec.Type}
	if err := d.giveSettings(ctx, made, fresh); err != nil {
		return err
	}
	_, err = d.waitRunning(ctx, made)
	if noUserNamespaces(err) {
		return agentWithoutUserNamespace(err)
	}
	return err
}

// SetVMMetadata implements driver.Driver: labels where Kubernetes' rules
// allow, annotations always.
func (d *Driver) SetVMMetadata(ctx context.Context, cid string, md map[string]string) error {
	if _, err := validName("vm", vmPrefix, cid); err != nil {
		return err
	}
	pod, err := d.pod(ctx, cid)
	if err != nil {
		return err
	}
	return d.patchMeta(ctx, "pod "+cid, pod.Annotations, md, func(ctx context.Context, patch []byte) error {
		_, err := d.cs.CoreV1().Pods(d.ns).Patch(ctx, cid, types.MergePatchType, patch, metav1.PatchOptions{})
		return err
	})
}

// patchMeta merges md into the labels and annotations (now: current) of
// an object.
func (d *Driver) patchMeta(ctx context.Context, what string, current, md map[string]string, patch func(context.Context, []byte) error) error {
	l, a := map[string]string{}, map[string]string{annoOddTags: current[annoOddTags]}
	tagMeta(md, l, a)
	lp := map[string]any{}
	for k, v := range l {
		lp[k] = v
	}
	for k := range md { // a value no longer label-safe drops the old label
		if _, ok := l[labelPrefix+k]; !ok && len(validation.IsQualifiedName(labelPrefix+k)) == 0 {
			lp[labelPrefix+k] = nil
		}
	}
	b, _ := json.Marshal(map[string]any{"metadata": map[string]any{"labels": lp, "annotations": a}})
	if err := d.do(ctx, "label "+what, func(ctx context.Context) error { return patch(ctx, b) }); err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("%s: %w", what, driver.ErrVMNotFound)
		}
		return d.apiErr("label "+what, err)
	}
	return nil
}

// ListVMs implements driver.VMLister: the driver's pods carrying every
// tag in match.
func (d *Driver) ListVMs(ctx context.Context, match map[string]string) ([]driver.VMInfo, error) {
	pods, err := d.ownPods(ctx)
	if err != nil {
		return nil, err
	}
	var out []driver.VMInfo
	for _, p := range pods {
		tags := tagsOf(p.Annotations)
		ok := true
		for k, v := range match {
			if tags[k] != v {
				ok = false
				break
			}
		}
		if !ok || p.DeletionTimestamp != nil {
			continue
		}
		info := driver.VMInfo{CID: p.Name, AgentID: p.Annotations[annoAgentID], Tags: tags, Metadata: tags, State: stateOf(&p)}
		if p.Status.PodIP != "" {
			info.Networks = driver.Networks{"default": {Type: "dynamic", IP: p.Status.PodIP}}
		}
		out = append(out, info)
	}
	return out, nil
}

func stateOf(p *corev1.Pod) string {
	switch {
	case p.Status.Phase == corev1.PodSucceeded || exitedCleanly(p):
		// The phase follows the container's exit a moment later.
		return "stopped"
	case failureOf(p) != nil:
		return "error"
	case p.Status.Phase == corev1.PodRunning:
		return "running"
	}
	return "unknown"
}

// exitedCleanly: every container of the pod ended with status 0.
func exitedCleanly(p *corev1.Pod) bool {
	for _, s := range p.Status.ContainerStatuses {
		if t := s.State.Terminated; t == nil || t.ExitCode != 0 {
			return false
		}
	}
	return len(p.Status.ContainerStatuses) > 0
}

// ownPods lists the driver's VM pods.
func (d *Driver) ownPods(ctx context.Context) ([]corev1.Pod, error) {
	sel := labels.SelectorFromSet(d.ownLabels("vm")).String()
	var list *corev1.PodList
	if err := d.do(ctx, "list pods", func(ctx context.Context) error {
		var err error
		list, err = d.cs.CoreV1().Pods(d.ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		return err
	}); err != nil {
		return nil, d.apiErr("list pods", err)
	}
	return list.Items, nil
}

// CalculateVMCloudProperties implements driver.VMSizer: the resources
// become the pod's requests and limits.
func (d *Driver) CalculateVMCloudProperties(_ context.Context, r driver.Resources) (driver.Props, error) {
	return driver.PropsOf(map[string]any{"cpu": r.CPU, "ram": r.RAM, "ephemeral_disk_size": r.EphemeralDiskSize}), nil
}

// podSecurityRefusal is how the API's Pod Security admission says no.
const podSecurityRefusal = "violates PodSecurity"

// apiErr names the operation; the API's own message is kept.
func (d *Driver) apiErr(op string, err error) error {
	if apierrors.IsForbidden(err) && strings.Contains(err.Error(), podSecurityRefusal) {
		return fmt.Errorf("kubernetes %s: the Pod Security level of namespace %s refuses it: %w", op, d.ns, err)
	}
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("kubernetes %s: forbidden (the Role in docs/kubernetes.md grants what the driver needs): %w", op, err)
	}
	return fmt.Errorf("kubernetes %s: %w", op, err)
}
