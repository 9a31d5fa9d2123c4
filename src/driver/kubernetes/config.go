package kubernetes

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/tarcheck"
)

// Config is the "kubernetes" section of the CPI config.
type Config struct {
	// Kubeconfig is a kubeconfig file; empty: the pod's service account
	// (in-cluster).
	Kubeconfig string `json:"kubeconfig,omitempty"`
	// Context in the kubeconfig (its current context when empty): the
	// identity, so the host's alone.
	Context string `json:"context,omitempty"`
	// Namespace every object is made in (required). A request context may
	// name another one of AllowedNamespaces.
	Namespace string `json:"namespace"`
	// AllowedNamespaces a request context may choose, besides Namespace.
	AllowedNamespaces []string `json:"allowed_namespaces,omitempty"`
	// QPS and Burst are client-go's own rate limiter (defaults 20, 40).
	QPS   float32 `json:"qps,omitempty"`
	Burst int     `json:"burst,omitempty"`
	// Owner is the value of the runway.io/owner label on everything the
	// driver makes (default "runway-cpi"): what list_vms and sweeps select.
	Owner string `json:"owner,omitempty"`
	// StorageClass for disks whose cloud properties name none (empty: the
	// cluster's default class).
	StorageClass string `json:"storage_class,omitempty"`
	// DeleteGraceSeconds is a pod's termination grace period on
	// delete_vm, reboot_vm and disk changes (default 10).
	DeleteGraceSeconds *int64 `json:"delete_grace_seconds,omitempty"`
	// RunAsUser is the uid a pod runs as unless its VM type says (default
	// 1000: the restricted Pod Security Standard wants non-root).
	RunAsUser int64 `json:"run_as_user,omitempty"`
	// WaitTimeoutSeconds bounds create_vm's wait for Running and each wait
	// for a pod to go (default 900).
	WaitTimeoutSeconds int `json:"wait_timeout_seconds,omitempty"`
	// Registry takes heavy stemcells (rootfs tarballs) as images; unset,
	// only light stemcells are accepted.
	Registry *RegistryConfig `json:"registry,omitempty"`
	// SnapshotClass is the VolumeSnapshotClass of snapshot_disk (empty:
	// the cluster's default class).
	SnapshotClass string `json:"snapshot_class,omitempty"`
	// MaxImageMiB and MaxImageEntries bound a heavy stemcell's content
	// (declared sizes, entries), as the local driver's keys of the same
	// names do.
	MaxImageMiB     int `json:"max_image_mib,omitempty"`
	MaxImageEntries int `json:"max_image_entries,omitempty"`
	// BoshAgent allows VM types to ask for the agent profile
	// (cloud_properties.bosh_agent); without it they are refused.
	BoshAgent bool `json:"bosh_agent,omitempty"`
	// HostEquivalentAgents lets agent pods run without a user namespace
	// (hostUsers true): root in the pod is root on the node. Without it,
	// agent pods get hostUsers false, and a runtime that cannot do that
	// fails create_vm.
	HostEquivalentAgents bool `json:"host_equivalent_agents,omitempty"`
	// What cloud properties may name; each empty: nothing may be named.
	AllowedServiceAccounts  []string `json:"allowed_service_accounts,omitempty"`
	AllowedPriorityClasses  []string `json:"allowed_priority_classes,omitempty"`
	AllowedImagePullSecrets []string `json:"allowed_image_pull_secrets,omitempty"`
	AllowedRuntimeClasses   []string `json:"allowed_runtime_classes,omitempty"`
	// Scheduling a VM type may ask for, each as the config writes it: a
	// toleration (one tolerating every taint, a taint of the control
	// plane's), a node_selector pair key=value, a whole affinity (a pod
	// affinity can probe other namespaces' pods) must be listed.
	AllowedTolerations   []corev1.Toleration `json:"allowed_tolerations,omitempty"`
	AllowedNodeSelectors []string            `json:"allowed_node_selectors,omitempty"`
	AllowedAffinities    []corev1.Affinity   `json:"allowed_affinities,omitempty"`
	// HostAliases are /etc/hosts entries every pod gets (a forge's name,
	// on a cluster whose pods have no DNS for it): the host's, never a
	// VM type's.
	HostAliases []corev1.HostAlias `json:"host_aliases,omitempty"`
	// MaxCPU and MaxRAM (MiB) bound a VM type's cpu and ram.
	MaxCPU int `json:"max_cpu,omitempty"`
	MaxRAM int `json:"max_ram,omitempty"`
}

const (
	defaultOwner = "runway-cpi"
	defaultQPS   = 20
	defaultBurst = 40
	// The local driver's defaults: a stemcell's root file system holds
	// tens of thousands of files in a GiB or two.
	defaultMaxImageMiB     = 10 << 10
	defaultMaxImageEntries = 150000
	defaultMaxCPU          = 16
	defaultMaxRAM          = 64 << 10 // MiB
)

func parseConfig(section json.RawMessage) (Config, error) {
	var c Config
	if err := driver.DecodeConfig("kubernetes", section, &c); err != nil {
		return c, err
	}
	if c.Namespace == "" {
		return c, fmt.Errorf("kubernetes.namespace is required")
	}
	if errs := validation.IsDNS1123Label(c.Namespace); len(errs) > 0 {
		return c, fmt.Errorf("kubernetes.namespace %q: %s", c.Namespace, errs[0])
	}
	if c.Owner == "" {
		c.Owner = defaultOwner
	}
	if errs := validation.IsValidLabelValue(c.Owner); len(errs) > 0 {
		return c, fmt.Errorf("kubernetes.owner %q: %s", c.Owner, errs[0])
	}
	if c.QPS < 0 || c.Burst < 0 {
		return c, fmt.Errorf("kubernetes.qps and kubernetes.burst must not be negative")
	}
	if c.QPS == 0 {
		c.QPS = defaultQPS
	}
	if c.Burst == 0 {
		c.Burst = defaultBurst
	}
	if c.DeleteGraceSeconds != nil && *c.DeleteGraceSeconds < 0 {
		return c, fmt.Errorf("kubernetes.delete_grace_seconds must not be negative")
	}
	if c.RunAsUser < 0 {
		return c, fmt.Errorf("kubernetes.run_as_user must not be negative")
	}
	if c.RunAsUser == 0 {
		c.RunAsUser = 1000
	}
	if c.WaitTimeoutSeconds < 0 {
		return c, fmt.Errorf("kubernetes.wait_timeout_seconds must not be negative")
	}
	if err := c.limits(); err != nil {
		return c, err
	}
	if err := c.allowLists(); err != nil {
		return c, err
	}
	if r := c.Registry; r != nil {
		if r.Repository == "" {
			return c, fmt.Errorf("kubernetes.registry.repository is required")
		}
		if _, err := r.repo(); err != nil {
			return c, fmt.Errorf("kubernetes.registry.repository %q: %v", r.Repository, err)
		}
	}
	return c, nil
}

// limits checks and defaults the maxima.
func (c *Config) limits() error {
	for _, m := range []struct {
		key string
		v   *int
		def int
	}{{"max_image_mib", &c.MaxImageMiB, defaultMaxImageMiB}, {"max_image_entries", &c.MaxImageEntries, defaultMaxImageEntries},
		{"max_cpu", &c.MaxCPU, defaultMaxCPU}, {"max_ram", &c.MaxRAM, defaultMaxRAM}} {
		if *m.v < 0 {
			return fmt.Errorf("kubernetes.%s must be positive", m.key)
		}
		if *m.v == 0 {
			*m.v = m.def
		}
	}
	return nil
}

// allowLists checks the names in the allow lists.
func (c *Config) allowLists() error {
	for _, l := range []struct {
		key   string
		names []string
		check func(string) []string
	}{{"allowed_namespaces", c.AllowedNamespaces, validation.IsDNS1123Label},
		{"allowed_service_accounts", c.AllowedServiceAccounts, validation.IsDNS1123Subdomain},
		{"allowed_priority_classes", c.AllowedPriorityClasses, validation.IsDNS1123Subdomain},
		{"allowed_image_pull_secrets", c.AllowedImagePullSecrets, validation.IsDNS1123Subdomain},
		{"allowed_runtime_classes", c.AllowedRuntimeClasses, validation.IsDNS1123Subdomain}} {
		for i, n := range l.names {
			if errs := l.check(n); len(errs) > 0 {
				return fmt.Errorf("kubernetes.%s[%d] %q: %s", l.key, i, n, errs[0])
			}
		}
	}
	for i, kv := range c.AllowedNodeSelectors {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || len(validation.IsQualifiedName(k)) > 0 || len(validation.IsValidLabelValue(v)) > 0 {
			return fmt.Errorf("kubernetes.allowed_node_selectors[%d] %q: want a node label as key=value", i, kv)
		}
	}
	return nil
}

// imageLimits is a heavy stemcell's budget.
func (c Config) imageLimits() tarcheck.Limits {
	return tarcheck.Limits{Bytes: int64(c.MaxImageMiB) << 20, Entries: int64(c.MaxImageEntries)}
}

func (c Config) grace() int64 {
	if c.DeleteGraceSeconds != nil {
		return *c.DeleteGraceSeconds
	}
	return 10
}

func (c Config) waitTimeout() time.Duration {
	if c.WaitTimeoutSeconds > 0 {
		return time.Duration(c.WaitTimeoutSeconds) * time.Second
	}
	return 15 * time.Minute
}

// contextKeys are the keys a request's context (a Director cpi-config)
// may set: the namespace, one of allowed_namespaces (checkContext). The
// kubeconfig, its context (the identity), the limits and allow lists are
// the host's.
var contextKeys = []string{"namespace"}

// checkContext holds the namespace of section (the host's, with a
// request context over it) to the host's: the same, or one of its
// allowed_namespaces.
func checkContext(section, host json.RawMessage) error {
	if host == nil {
		return nil
	}
	var merged, own struct {
		Namespace string   `json:"namespace"`
		Allowed   []string `json:"allowed_namespaces"`
	}
	if json.Unmarshal(section, &merged) != nil || json.Unmarshal(host, &own) != nil {
		return nil // the strict decoding names what is wrong
	}
	if merged.Namespace == own.Namespace || slices.Contains(own.Allowed, merged.Namespace) {
		return nil
	}
	return fmt.Errorf("kubernetes.namespace %q from the request context is not one the config allows (%s): a context may choose only among kubernetes.allowed_namespaces",
		merged.Namespace, strings.Join(append([]string{own.Namespace}, own.Allowed...), ", "))
}
