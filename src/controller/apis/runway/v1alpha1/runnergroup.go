package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// RunnerGroupSpec is one pool of runners: runway.yml's groups[], its
// forge a Forge of the same namespace.
//
// +kubebuilder:validation:XValidation:rule="self.scope != 'org' || (has(self.org) && size(self.org) > 0)",message="org is required for scope org",fieldPath=".org",reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="self.scope != 'user' || (has(self.user) && size(self.user) > 0)",message="user is required for scope user",fieldPath=".user",reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="self.scope != 'repo' || (has(self.repo) && self.repo.matches('^[^/]+/[^/]+$'))",message="repo must be owner/name for scope repo",fieldPath=".repo",reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="self.scope != 'enterprise' || (has(self.enterprise) && size(self.enterprise) > 0 && self.demand == 'scale_set')",message="scope enterprise needs enterprise (its slug) and demand scale_set",fieldPath=".enterprise",reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="!has(self.minIdle) || self.minIdle <= self.maxActiveRunners",message="minIdle must be at most maxActiveRunners",fieldPath=".minIdle"
// +kubebuilder:validation:XValidation:rule="has(self.image) != has(self.stemcellCID)",message="set exactly one of image or stemcellCID",fieldPath=".image",reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="!has(self.scaleSet) || self.demand == 'scale_set'",message="scaleSet is set only with demand scale_set",fieldPath=".scaleSet"
// +kubebuilder:validation:XValidation:rule="oldSelf.demand == self.demand && has(oldSelf.scaleSet) == has(self.scaleSet) && (!has(self.scaleSet) || oldSelf.scaleSet == self.scaleSet)",message="demand and scaleSet cannot change: delete the group and make it anew",fieldPath=".demand"
// +kubebuilder:validation:XValidation:rule="oldSelf.forge == self.forge && oldSelf.scope == self.scope && has(oldSelf.org) == has(self.org) && (!has(self.org) || oldSelf.org == self.org) && has(oldSelf.user) == has(self.user) && (!has(self.user) || oldSelf.user == self.user) && has(oldSelf.repo) == has(self.repo) && (!has(self.repo) || oldSelf.repo == self.repo) && has(oldSelf.enterprise) == has(self.enterprise) && (!has(self.enterprise) || oldSelf.enterprise == self.enterprise)",message="forge, scope, org, user, repo and enterprise cannot change: delete the group and make it anew",fieldPath=".scope"
type RunnerGroupSpec struct {
	// Forge is the name of a Forge in the group's namespace.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Forge string `json:"forge"`
	// Scope of the runners: global (Gitea/Forgejo admin), org, user
	// (Gitea/Forgejo: the token's own user), repo, or enterprise (GitHub
	// scale sets, with a classic PAT). GitHub: org, repo or enterprise.
	// +kubebuilder:validation:Enum=global;org;user;repo;enterprise
	// +required
	Scope string `json:"scope"`
	// +optional
	// +kubebuilder:validation:MaxLength=100
	Org string `json:"org,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxLength=100
	User string `json:"user,omitempty"`
	// Repo is owner/name (scope repo).
	// +optional
	// +kubebuilder:validation:MaxLength=200
	Repo string `json:"repo,omitempty"`
	// Enterprise is the enterprise's slug (scope enterprise).
	// +optional
	// +kubebuilder:validation:MaxLength=100
	Enterprise string `json:"enterprise,omitempty"`
	// Labels the runners offer: name, name:host, name:docker://image (the
	// runners register the names, which jobs are matched on; a label a
	// runner could not register as written is refused). No default
	// labels are added.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:Pattern=`^[^,\s]+$`
	// +required
	Labels []string `json:"labels"`
	// MaxActiveRunners bounds the runners whose pod may exist.
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +required
	MaxActiveRunners int32 `json:"maxActiveRunners"`
	// MinIdle runners are kept ready beyond the queue (a warm pool).
	// +optional
	// +kubebuilder:default=0
	// +kubebuilder:validation:Minimum=0
	MinIdle int32 `json:"minIdle,omitempty"`
	// Priority decides between two groups equally fit for a job (same
	// scope specificity, as many labels): the higher claims it; equal
	// priorities go by name.
	// +optional
	// +kubebuilder:default=0
	Priority int32 `json:"priority,omitempty"`
	// Image is the runner's image (a light stemcell: the pod runs it).
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=1024
	Image string `json:"image,omitempty"`
	// StemcellCID is a stemcell the CPI already has, instead of image.
	// +optional
	// +kubebuilder:validation:MinLength=1
	StemcellCID string `json:"stemcellCID,omitempty"`
	// CloudProperties are the runner VM's cloud properties, passed to
	// create_vm as they are (the Kubernetes driver's: cpu, ram,
	// node_selector, tolerations, …; docs/kubernetes.md).
	// +optional
	// +kubebuilder:pruning:PreserveUnknownFields
	// +kubebuilder:validation:Type=object
	// +kubebuilder:validation:Schemaless
	CloudProperties *runtime.RawExtension `json:"cloudProperties,omitempty"`
	// Runner is what the runner's pod runs.
	// +required
	Runner Runner `json:"runner"`
	// Timeouts bound a runner's life.
	// +optional
	// +kubebuilder:default={}
	Timeouts Timeouts `json:"timeouts,omitempty"`
	// PollInterval overrides the forge's.
	// +optional
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	PollInterval string `json:"pollInterval,omitempty"`
	// Demand is where the group learns of its jobs: forge (the forge's
	// job listing, polled, kept current by webhooks) or scale_set
	// (GitHub: a runner scale set's message session, long-polled;
	// nothing inbound).
	// +optional
	// +kubebuilder:default=forge
	// +kubebuilder:validation:Enum=forge;scale_set
	Demand string `json:"demand,omitempty"`
	// ScaleSet names the runner scale set (demand scale_set).
	// +optional
	ScaleSet *ScaleSet `json:"scaleSet,omitempty"`
	// SpawnConcurrency bounds parallel create_vm calls.
	// +optional
	// +kubebuilder:default=4
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	SpawnConcurrency int32 `json:"spawnConcurrency,omitempty"`
}

// ScaleSet is the GitHub runner scale set a group takes its jobs from.
type ScaleSet struct {
	// Name of the scale set (default: the RunnerGroup's name).
	// +optional
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9._-]{1,45}$`
	Name string `json:"name,omitempty"`
	// RunnerGroupID is the runner group it belongs to (default: the
	// Forge's runnerGroupID).
	// +optional
	// +kubebuilder:validation:Minimum=1
	RunnerGroupID int64 `json:"runnerGroupID,omitempty"`
}

// Runner is the runner program: the command (a path in the image) the
// bootstrap execs, its arguments and environment.
type Runner struct {
	// +kubebuilder:validation:MinLength=1
	// +required
	Command string `json:"command"`
	// +optional
	Args []string `json:"args,omitempty"`
	// Env adds variables (Runway's own RUNWAY_*, GITEA_*, FORGEJO_* win).
	// +optional
	Env map[string]string `json:"env,omitempty"`
}

// Timeouts bound a runner's life (durations: 90s, 15m, 2h).
type Timeouts struct {
	// Spawn: a runner not seen registered by then is replaced.
	// +optional
	// +kubebuilder:default="10m"
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	Spawn string `json:"spawn,omitempty"`
	// Idle: a runner without a job is deleted past this.
	// +optional
	// +kubebuilder:default="15m"
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	Idle string `json:"idle,omitempty"`
	// MaxLifetime: any runner is deleted past this.
	// +optional
	// +kubebuilder:default="6h"
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	MaxLifetime string `json:"maxLifetime,omitempty"`
	// Pickup: a runner online this long that took none of the group's
	// jobs queued as long takes none (condition RunnersNotTakingJobs):
	// the group makes no more meanwhile.
	// +optional
	// +kubebuilder:default="2m"
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	Pickup string `json:"pickup,omitempty"`
}

// RunnerGroupStatus is seed 001's status and Runway's additions.
type RunnerGroupStatus struct {
	// ActiveRunners counts the runners whose pod may exist.
	ActiveRunners int32 `json:"activeRunners"`
	// +optional
	LastCheckTime *metav1.Time `json:"lastCheckTime,omitempty"`
	// +optional
	QueuedJobs int32 `json:"queuedJobs,omitempty"`
	// +optional
	Idle int32 `json:"idle,omitempty"`
	// +optional
	Busy int32 `json:"busy,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, and why not (reason SecretMissing,
	// ForgeMissing, ForgeUnreachable, TokenScopeMissing, Invalid,
	// Deleting).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RunnerGroup is a pool of ephemeral runners of one Forge.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=runway
// +kubebuilder:printcolumn:name="Forge",type=string,JSONPath=`.spec.forge`
// +kubebuilder:printcolumn:name="Scope",type=string,JSONPath=`.spec.scope`
// +kubebuilder:printcolumn:name="Max",type=integer,JSONPath=`.spec.maxActiveRunners`
// +kubebuilder:printcolumn:name="Active",type=integer,JSONPath=`.status.activeRunners`
// +kubebuilder:printcolumn:name="Queued",type=integer,JSONPath=`.status.queuedJobs`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type RunnerGroup struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   RunnerGroupSpec   `json:"spec"`
	Status RunnerGroupStatus `json:"status,omitempty"`
}

// RunnerGroupList is a list of RunnerGroups.
//
// +kubebuilder:object:root=true
type RunnerGroupList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RunnerGroup `json:"items"`
}
