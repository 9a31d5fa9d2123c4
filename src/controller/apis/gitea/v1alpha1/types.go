package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// RunnerGroupSpec is the seed's spec. What the scope needs is checked by
// the API server: org for org, user for user, and for repo the
// repository (owner/name, or name with org or user as its owner). The
// forge and the scope cannot change once made (its runners were
// registered there): delete the group and make it anew.
//
// +kubebuilder:validation:XValidation:rule="self.scope != 'org' || (has(self.org) && size(self.org) > 0)",message="org is required for scope org",fieldPath=".org",reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="self.scope != 'user' || (has(self.user) && size(self.user) > 0)",message="user is required for scope user",fieldPath=".user",reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="self.scope != 'repo' || (has(self.repo) && (self.repo.contains('/') || (has(self.org) && size(self.org) > 0) || (has(self.user) && size(self.user) > 0)))",message="repo is required for scope repo: owner/name, or name with org or user as its owner",fieldPath=".repo",reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="has(self.gitea) != has(self.giteaURL)",message="set gitea.url (or giteaURL, gitea-runner-operator's name for it), not both",fieldPath=".gitea",reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="oldSelf.scope == self.scope && has(oldSelf.org) == has(self.org) && (!has(self.org) || oldSelf.org == self.org) && has(oldSelf.user) == has(self.user) && (!has(self.user) || oldSelf.user == self.user) && has(oldSelf.repo) == has(self.repo) && (!has(self.repo) || oldSelf.repo == self.repo)",message="scope, org, user and repo cannot change: delete the group and make it anew",fieldPath=".scope"
type RunnerGroupSpec struct {
	// Scope of the runners: global (a Gitea admin's token), org, user or
	// repo.
	// +kubebuilder:validation:Enum=global;org;user;repo
	// +required
	Scope string `json:"scope"`

	// Org is the organization (scope org; the repository's owner for
	// scope repo).
	// +optional
	// +kubebuilder:validation:MaxLength=100
	Org string `json:"org,omitempty"`

	// User is the user (scope user: on Gitea the API token's own user;
	// the repository's owner for scope repo, before org).
	// +optional
	// +kubebuilder:validation:MaxLength=100
	User string `json:"user,omitempty"`

	// Repo is the repository (scope repo): owner/name, or its name with
	// user or org as its owner.
	// +optional
	// +kubebuilder:validation:MaxLength=200
	Repo string `json:"repo,omitempty"`

	// Gitea is the instance (the seed specification's gitea.url).
	// +optional
	Gitea *Gitea `json:"gitea,omitempty"`

	// GiteaURL is gitea-runner-operator's own field for gitea.url.
	// +optional
	// +kubebuilder:validation:Pattern=`^https?://[^\s]+$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="giteaURL cannot change: delete the group and make it anew"
	GiteaURL string `json:"giteaURL,omitempty"`

	// Labels the runners offer (name, name:host, name:docker://image): the
	// runners register the names, which jobs are matched on. The
	// operator's default labels (the seed's ubuntu-latest and others) are
	// added, but for names the group has; a label a runner could not
	// register as written (app:infra) is refused on the status.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:Pattern=`^[^,\s]+$`
	Labels []string `json:"labels,omitempty"`

	// MaxActiveRunners bounds the runners whose pod may exist (being
	// made, idle, busy or being deleted).
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=10000
	// +required
	MaxActiveRunners int32 `json:"maxActiveRunners"`

	// RegistrationToken is read and must exist (a missing Secret or key
	// makes the group not Ready), but Runway does not hand it to runners:
	// it asks the forge, with authToken, for the scope's registration
	// token each time, so a rotated token needs no edit.
	// +required
	RegistrationToken SecretKeySelector `json:"registrationToken"`

	// AuthToken is the Gitea API token Runway lists jobs and runners,
	// gets registration tokens and removes runners with; its scopes are
	// checked (a missing one is the Ready condition's reason).
	// +required
	AuthToken SecretKeySelector `json:"authToken"`
}

// Gitea is the seed specification's gitea object.
type Gitea struct {
	// URL is the base URL of the Gitea instance; runners connect to it
	// too.
	// +kubebuilder:validation:Pattern=`^https?://[^\s]+$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="gitea.url cannot change: delete the group and make it anew"
	// +required
	URL string `json:"url"`
}

// SecretKeySelector names a key of a Secret in the group's namespace:
// as Kubernetes' own selector (name, key), or as the seed specification
// writes it (secretRef.name, secretRef.key).
//
// +kubebuilder:validation:XValidation:rule="(has(self.name) && has(self.key)) != has(self.secretRef)",message="name the Secret and its key: name and key, or secretRef.name and secretRef.key"
type SecretKeySelector struct {
	// Name of the Secret.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Name string `json:"name,omitempty"`
	// Key within the Secret.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Key string `json:"key,omitempty"`
	// Optional is accepted as in Kubernetes' selector; the token is
	// needed all the same.
	// +optional
	Optional *bool `json:"optional,omitempty"`
	// SecretRef is the seed specification's form.
	// +optional
	SecretRef *SecretRef `json:"secretRef,omitempty"`
}

// SecretRef is the seed specification's secretRef.
type SecretRef struct {
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Name string `json:"name"`
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +required
	Key string `json:"key"`
}

// Ref answers the Secret's name and key, whichever form names them.
func (s SecretKeySelector) Ref() (name, key string) {
	if s.SecretRef != nil {
		return s.SecretRef.Name, s.SecretRef.Key
	}
	return s.Name, s.Key
}

// URL is the instance's URL, whichever field names it.
func (s RunnerGroupSpec) URL() string {
	if s.Gitea != nil {
		return s.Gitea.URL
	}
	return s.GiteaURL
}

// RunnerGroupStatus is the seed's status (activeRunners, lastCheckTime)
// and Runway's additions.
type RunnerGroupStatus struct {
	// ActiveRunners counts the runners whose pod may exist (being made,
	// idle, busy or being deleted).
	ActiveRunners int32 `json:"activeRunners"`
	// LastCheckTime is the last time the group's queue was looked at.
	// +optional
	LastCheckTime *metav1.Time `json:"lastCheckTime,omitempty"`
	// QueuedJobs the group claims.
	// +optional
	QueuedJobs int32 `json:"queuedJobs,omitempty"`
	// ObservedGeneration is the spec's generation the status is for.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready, and why not (its reason: SecretMissing,
	// ForgeUnreachable, TokenScopeMissing, Invalid, Deleting).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RunnerGroup is seed 001's runner pool, run by Runway's engine.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=rg,categories=runway
// +kubebuilder:printcolumn:name="Scope",type=string,JSONPath=`.spec.scope`
// +kubebuilder:printcolumn:name="Max",type=integer,JSONPath=`.spec.maxActiveRunners`
// +kubebuilder:printcolumn:name="Active",type=integer,JSONPath=`.status.activeRunners`
// +kubebuilder:printcolumn:name="Queued",type=integer,JSONPath=`.status.queuedJobs`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`,priority=1
// +kubebuilder:printcolumn:name="Last check",type=date,JSONPath=`.status.lastCheckTime`
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
