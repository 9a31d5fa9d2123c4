package kubernetes

import (
	"encoding/json"
	"maps"
	"path"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/agentprofile"
)

// settingsSecret holds what the agent reads: its settings, the user data
// and metadata pointing at them; and the VM's user-data script, if any.
func (d *Driver) settingsSecret(cid string, settings []byte, userData string) *corev1.Secret {
	ud, _ := json.Marshal(map[string]any{"server": map[string]string{"name": cid},
		"registry": map[string]string{"endpoint": path.Join(agentDir, agentSettingsKey)}})
	md, _ := json.Marshal(map[string]any{"instance-id": cid, "hostname": cid})
	data := map[string][]byte{userDataJSONKey: ud, metadataJSONKey: md}
	if settings != nil {
		data[agentSettingsKey] = preconfigured(settings)
	}
	if userData != "" {
		data[userDataKey] = []byte(userData)
	}
	l := d.ownLabels("settings")
	l[labelVM] = cid
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: settingsName(cid), Labels: l}, Data: data,
		Type: corev1.SecretTypeOpaque}
}

// preconfigured marks each network of the agent's settings preconfigured:
// the cluster set up the pod's interface, and the agent must not (it
// would write /etc/systemd/network, which the stemcell lacks, and stop:
// seen with the real agent and Director on the dev cluster). The warden
// CPI and the local driver's container mode do the same. The agent still
// reads a dynamic network's address from its interface.
func preconfigured(settings []byte) []byte {
	var m map[string]any
	if json.Unmarshal(settings, &m) != nil || m == nil {
		return settings
	}
	nets, _ := m["networks"].(map[string]any)
	for name, n := range nets {
		entry, _ := n.(map[string]any)
		if entry == nil {
			entry = map[string]any{}
		}
		entry["preconfigured"] = true
		nets[name] = entry
	}
	b, err := json.Marshal(m)
	if err != nil {
		return settings
	}
	return b
}

// podFor is the pod of a VM: restricted by default (non-root, no
// privilege escalation, no capabilities, the runtime's seccomp profile).
func (d *Driver) podFor(cid string, spec driver.VMSpec, p vmProps, image string, cmd []string, disks []string) *corev1.Pod {
	l := d.ownLabels("vm")
	l[labelVM] = cid
	annos := map[string]string{annoAgentID: spec.AgentID, annoStemcell: spec.StemcellCID}
	tagMeta(spec.Tags, l, annos)
	uid := d.cfg.RunAsUser
	if p.RunAsUser > 0 {
		uid = p.RunAsUser
	}
	res := corev1.ResourceList{}
	if p.CPU > 0 {
		res[corev1.ResourceCPU] = *resource.NewQuantity(int64(p.CPU), resource.DecimalSI)
	}
	if p.RAM > 0 {
		res[corev1.ResourceMemory] = resource.MustParse(mib(p.RAM))
	}
	if p.EphemeralDiskSize > 0 {
		res[corev1.ResourceEphemeralStorage] = resource.MustParse(mib(p.EphemeralDiskSize))
	}
	env := []corev1.EnvVar{{Name: "RUNWAY_VM_CID", Value: cid}, {Name: "RUNWAY_AGENT_ID", Value: spec.AgentID},
		{Name: "RUNWAY_AGENT_SETTINGS", Value: path.Join(agentDir, agentSettingsKey)}, {Name: "RUNWAY_DISKS_DIR", Value: diskMountDir}}
	for _, k := range slices.Sorted(maps.Keys(p.Env)) {
		env = append(env, corev1.EnvVar{Name: k, Value: literal(p.Env[k])})
	}
	mounts := []corev1.VolumeMount{}
	var items []corev1.KeyToPath
	keys := []string{userDataJSONKey, metadataJSONKey}
	if spec.AgentSettings != nil {
		keys = append(keys, agentSettingsKey)
	}
	if p.UserData != "" {
		keys = append(keys, userDataKey)
	}
	for _, key := range keys {
		mounts = append(mounts, corev1.VolumeMount{Name: "agent", MountPath: path.Join(agentDir, key), SubPath: key, ReadOnly: true})
		mode := int32(0o440)
		if key == userDataKey {
			mode = 0o550
		}
		items = append(items, corev1.KeyToPath{Key: key, Path: key, Mode: ptr.To(mode)})
	}
	vols := []corev1.Volume{{Name: "agent", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
		SecretName: settingsName(cid), Items: items, DefaultMode: ptr.To[int32](0o440)}}}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: cid, Labels: l, Annotations: annos},
		Spec: corev1.PodSpec{
			RestartPolicy:                 p.RestartPolicy,
			TerminationGracePeriodSeconds: ptr.To(d.cfg.grace()),
			AutomountServiceAccountToken:  ptr.To(p.ServiceAccount != ""),
			ServiceAccountName:            p.ServiceAccount,
			NodeSelector:                  p.NodeSelector,
			Tolerations:                   p.Tolerations,
			Affinity:                      p.Affinity,
			PriorityClassName:             p.PriorityClassName,
			ImagePullSecrets:              p.ImagePullSecrets,
			HostAliases:                   d.cfg.HostAliases,
			Hostname:                      "",
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To(uid),
				RunAsGroup: ptr.To(uid), FSGroup: ptr.To(uid),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name: containerName, Image: image, Command: literals(cmd), Env: env, ImagePullPolicy: corev1.PullIfNotPresent,
				Resources:       corev1.ResourceRequirements{Requests: res, Limits: res},
				VolumeMounts:    mounts,
				SecurityContext: containerSecurity(p.BoshAgent),
			}},
			Volumes: vols,
		},
	}
	if p.RuntimeClassName != "" {
		pod.Spec.RuntimeClassName = ptr.To(p.RuntimeClassName)
	}
	if p.BoshAgent {
		// The agent is root; the files it is given stay root's. Root of
		// a user namespace of its own unless the host allows more.
		pod.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(false), RunAsUser: ptr.To[int64](0),
			RunAsGroup: ptr.To[int64](0), SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
		d.agentUsers(&pod.Spec)
	}
	for _, dc := range disks {
		withDisk(pod, dc)
	}
	return pod
}

// literal escapes Kubernetes' variable references: the kubelet turns
// "$$" into "$" and "$(NAME)" into NAME's value in a command and an env
// value; a VM's command and env mean what they say ("echo $$" in a shell).
func literal(s string) string { return strings.ReplaceAll(s, "$", "$$") }

func literals(argv []string) []string {
	if argv == nil {
		return nil
	}
	out := make([]string, len(argv))
	for i, a := range argv {
		out[i] = literal(a)
	}
	return out
}

// containerSecurity is restricted (no privilege escalation, every
// capability dropped), or the agent profile: runc's three default
// capabilities plus the agent's, setuid programs allowed (sudo, su, monit's
// jobs as vcap), still under the runtime's seccomp profile.
func containerSecurity(agent bool) *corev1.SecurityContext {
	if !agent {
		return &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false),
			Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	}
	var add []corev1.Capability
	for _, c := range append(append([]string{}, agentprofile.DefaultCaps...), agentprofile.Caps...) {
		add = append(add, corev1.Capability(strings.TrimPrefix(c, "CAP_")))
	}
	return &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(true),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}, Add: add}}
}

// withDisk mounts disk dc's claim at the agent's disk path.
func withDisk(pod *corev1.Pod, dc string) {
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: dc, VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: dc}}})
	c := &pod.Spec.Containers[0]
	c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: dc, MountPath: path.Join(diskMountDir, dc)})
}
