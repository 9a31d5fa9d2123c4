package kubernetes

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/runway-cpi/runway/src/driver"
)

// vmProps are a VM type's cloud properties.
type vmProps struct {
	// calculate_vm_cloud_properties' answer: requests and limits.
	CPU               int `json:"cpu,omitempty"`
	RAM               int `json:"ram,omitempty"`                 // MiB
	EphemeralDiskSize int `json:"ephemeral_disk_size,omitempty"` // MiB
	// Command is an argv array or a shell string (run by /bin/sh -c); empty:
	// the image's entrypoint.
	Command json.RawMessage   `json:"command,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// UserData is a script run as the command when there is none (else
	// environment.user_data, as the orchestrator sends a runner's).
	UserData string `json:"user_data,omitempty"`
	// Scheduling and identity, as a PodSpec has them.
	NodeSelector      map[string]string             `json:"node_selector,omitempty"`
	Tolerations       []corev1.Toleration           `json:"tolerations,omitempty"`
	Affinity          *corev1.Affinity              `json:"affinity,omitempty"`
	PriorityClassName string                        `json:"priority_class_name,omitempty"`
	ServiceAccount    string                        `json:"service_account_name,omitempty"`
	RuntimeClassName  string                        `json:"runtime_class_name,omitempty"`
	ImagePullSecrets  []corev1.LocalObjectReference `json:"image_pull_secrets,omitempty"`
	// RestartPolicy: Never (default: a VM whose process ended is stopped,
	// as the local driver's), OnFailure or Always.
	RestartPolicy corev1.RestartPolicy `json:"restart_policy,omitempty"`
	// RunAsUser overrides kubernetes.run_as_user (non-root only).
	RunAsUser int64 `json:"run_as_user,omitempty"`
	// BoshAgent: the pod runs as root with the agent's capabilities
	// (agentprofile.Caps), as the local driver's agent profile — more than
	// the restricted Pod Security Standard allows: the namespace must admit
	// privileged pods. Only where kubernetes.bosh_agent allows it; in a
	// user namespace unless kubernetes.host_equivalent_agents.
	BoshAgent bool `json:"bosh_agent,omitempty"`
}

// decodeVMProps decodes a VM type's cloud properties and holds them to
// what the config allows.
func decodeVMProps(p driver.Props, cfg Config) (vmProps, error) {
	var v vmProps
	if err := p.Decode("cloud_properties", &v); err != nil {
		return v, err
	}
	if v.CPU < 0 || v.RAM < 0 || v.EphemeralDiskSize < 0 {
		return v, driver.Invalid("cloud_properties: cpu, ram and ephemeral_disk_size must not be negative")
	}
	if err := v.allowed(cfg); err != nil {
		return v, err
	}
	if v.RunAsUser < 0 {
		return v, driver.Invalid("cloud_properties.run_as_user must be a non-root uid")
	}
	if v.BoshAgent && v.RunAsUser > 0 {
		return v, driver.Invalid("cloud_properties.run_as_user and bosh_agent: the agent runs as root")
	}
	switch v.RestartPolicy {
	case "":
		v.RestartPolicy = corev1.RestartPolicyNever
	case corev1.RestartPolicyNever, corev1.RestartPolicyOnFailure, corev1.RestartPolicyAlways:
	default:
		return v, driver.Invalid("cloud_properties.restart_policy %q: want Never, OnFailure or Always", v.RestartPolicy)
	}
	return v, nil
}

// allowed refuses, by name, what the config does not allow a VM type:
// the agent profile without kubernetes.bosh_agent, sizes past the maxima,
// names outside the allow lists.
func (p vmProps) allowed(cfg Config) error {
	if p.BoshAgent && !cfg.BoshAgent {
		return driver.Invalid("cloud_properties.bosh_agent: the agent profile is not allowed by this CPI's config (kubernetes.bosh_agent is off)")
	}
	if p.CPU > cfg.MaxCPU {
		return driver.Invalid("cloud_properties.cpu %d is more than the %d CPUs kubernetes.max_cpu allows", p.CPU, cfg.MaxCPU)
	}
	if p.RAM > cfg.MaxRAM {
		return driver.Invalid("cloud_properties.ram %d MiB is more than the %d MiB kubernetes.max_ram allows", p.RAM, cfg.MaxRAM)
	}
	one := func(prop, v, key string, allowed []string) error {
		if v == "" || slices.Contains(allowed, v) {
			return nil
		}
		may := "none"
		if len(allowed) > 0 {
			may = strings.Join(allowed, ", ")
		}
		return driver.Invalid("cloud_properties.%s %q is not one of kubernetes.%s (%s)", prop, v, key, may)
	}
	if err := one("service_account_name", p.ServiceAccount, "allowed_service_accounts", cfg.AllowedServiceAccounts); err != nil {
		return err
	}
	if err := one("priority_class_name", p.PriorityClassName, "allowed_priority_classes", cfg.AllowedPriorityClasses); err != nil {
		return err
	}
	if err := one("runtime_class_name", p.RuntimeClassName, "allowed_runtime_classes", cfg.AllowedRuntimeClasses); err != nil {
		return err
	}
	for i, s := range p.ImagePullSecrets {
		if s.Name == "" {
			return driver.Invalid("cloud_properties.image_pull_secrets[%d].name is empty", i)
		}
		if err := one(fmt.Sprintf("image_pull_secrets[%d].name", i), s.Name, "allowed_image_pull_secrets", cfg.AllowedImagePullSecrets); err != nil {
			return err
		}
	}
	return p.scheduling(cfg)
}

// scheduling refuses, by name, tolerations, node_selector pairs and an
// affinity the config does not list: where a pod runs is the
// operator's (a toleration of every taint puts it next to the control
// plane; a pod affinity probes other namespaces' pods).
func (p vmProps) scheduling(cfg Config) error {
	for i, t := range p.Tolerations {
		if !slices.ContainsFunc(cfg.AllowedTolerations, func(a corev1.Toleration) bool { return sameToleration(a, t) }) {
			return driver.Invalid("cloud_properties.tolerations[%d] %s is not one of kubernetes.allowed_tolerations (%d listed)", i, quoteJSON(t),
				len(cfg.AllowedTolerations))
		}
	}
	keys := make([]string, 0, len(p.NodeSelector))
	for k := range p.NodeSelector {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if kv := k + "=" + p.NodeSelector[k]; !slices.Contains(cfg.AllowedNodeSelectors, kv) {
			may := "none"
			if len(cfg.AllowedNodeSelectors) > 0 {
				may = strings.Join(cfg.AllowedNodeSelectors, ", ")
			}
			return driver.Invalid("cloud_properties.node_selector %q is not one of kubernetes.allowed_node_selectors (%s)", kv, may)
		}
	}
	if p.Affinity != nil && !slices.ContainsFunc(cfg.AllowedAffinities, func(a corev1.Affinity) bool { return equality.Semantic.DeepEqual(a, *p.Affinity) }) {
		return driver.Invalid("cloud_properties.affinity is not one of kubernetes.allowed_affinities (%d listed)", len(cfg.AllowedAffinities))
	}
	return nil
}

// sameToleration: equal as the scheduler reads them (no operator is
// Equal).
func sameToleration(a, b corev1.Toleration) bool {
	op := func(t corev1.Toleration) corev1.TolerationOperator {
		if t.Operator == "" {
			return corev1.TolerationOpEqual
		}
		return t.Operator
	}
	return a.Key == b.Key && op(a) == op(b) && a.Value == b.Value && a.Effect == b.Effect &&
		equality.Semantic.DeepEqual(a.TolerationSeconds, b.TolerationSeconds)
}

func quoteJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// command is the container's command: an argv array, or a shell string.
func (p vmProps) command() ([]string, error) {
	if len(p.Command) == 0 {
		return nil, nil
	}
	var argv []string
	if json.Unmarshal(p.Command, &argv) == nil {
		return argv, nil
	}
	var s string
	if err := json.Unmarshal(p.Command, &s); err != nil {
		return nil, driver.Invalid("cloud_properties.command: want an array of strings or a string")
	}
	return []string{"/bin/sh", "-c", s}, nil
}

// takeUserData fills UserData from the environment when the VM type has
// none.
func (p *vmProps) takeUserData(env map[string]any) error {
	v, ok := env["user_data"]
	if p.UserData != "" || !ok || v == nil {
		return nil
	}
	s, ok := v.(string)
	if !ok {
		return driver.Invalid("environment.user_data must be a string")
	}
	p.UserData = s
	return nil
}

// diskProps are a disk type's cloud properties.
type diskProps struct {
	StorageClass string `json:"storage_class,omitempty"`
}

func decodeDiskProps(p driver.Props) (diskProps, error) {
	var v diskProps
	return v, p.Decode("cloud_properties", &v)
}

func mib(n int) string { return fmt.Sprintf("%dMi", n) }
