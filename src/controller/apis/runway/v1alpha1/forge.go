package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ForgeSpec is one forge: runway.yml's forges[] with its secrets in
// Secrets of the forge's namespace.
//
// +kubebuilder:validation:XValidation:rule="self.type != 'forgejo' || !has(self.webhookSecret)",message="Forgejo sends no workflow_job webhook: Runway polls it (leave the webhook secret out)",fieldPath=".webhookSecret"
// +kubebuilder:validation:XValidation:rule="self.type == 'github' || has(self.url)",message="url is required for gitea and forgejo",fieldPath=".url",reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="self.type == oldSelf.type",message="type cannot change: make another Forge",fieldPath=".type"
// +kubebuilder:validation:XValidation:rule="has(self.token) != has(self.githubConfigSecret)",message="set exactly one of token or githubConfigSecret",fieldPath=".token",reason=FieldValueRequired
// +kubebuilder:validation:XValidation:rule="!has(self.githubConfigSecret) || self.type == 'github'",message="githubConfigSecret is GitHub's",fieldPath=".githubConfigSecret"
type ForgeSpec struct {
	// Type of the forge.
	// +kubebuilder:validation:Enum=gitea;forgejo;github
	// +required
	Type string `json:"type"`
	// URL is the Gitea or Forgejo instance, or GitHub's API (default
	// https://api.github.com; GHES: https://host/api/v3).
	// +optional
	// +kubebuilder:validation:Pattern=`^https?://[^\s]+$`
	URL string `json:"url,omitempty"`
	// RunnerURL is the URL runners connect to (default: url; GitHub:
	// https://github.com).
	// +optional
	// +kubebuilder:validation:Pattern=`^https?://[^\s]+$`
	RunnerURL string `json:"runnerURL,omitempty"`
	// Token is the forge's API token (read again whenever the Secret
	// changes). Exactly one of token or githubConfigSecret.
	// +optional
	Token *corev1.SecretKeySelector `json:"token,omitempty"`
	// GitHubConfigSecret names a Secret of the forge's namespace holding
	// GitHub's credentials as actions-runner-controller's
	// githubConfigSecret does: github_token (a PAT), or github_app_id
	// (the App's id or client id), github_app_installation_id and
	// github_app_private_key (PEM) for a GitHub App installation. Read
	// again whenever the Secret changes.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	GitHubConfigSecret string `json:"githubConfigSecret,omitempty"`
	// WebhookSecret signs the forge's workflow_job deliveries to the
	// controller's Service (/webhooks/gitea, /webhooks/github); without
	// one, deliveries are refused and the forge is polled.
	// +optional
	WebhookSecret *corev1.SecretKeySelector `json:"webhookSecret,omitempty"`
	// PollInterval is how old a queue listing may be (default 15s;
	// GitHub 5m).
	// +optional
	// +kubebuilder:validation:Pattern=`^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$`
	PollInterval string `json:"pollInterval,omitempty"`
	// RunnerGroupID is the GitHub runner group JIT runners join
	// (default 1).
	// +optional
	// +kubebuilder:validation:Minimum=1
	RunnerGroupID int64 `json:"runnerGroupID,omitempty"`
}

// ForgeStatus says whether the forge's Secrets are there.
type ForgeStatus struct {
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready (reason SecretMissing when a Secret or key is
	// not there).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Forge is a Gitea, Forgejo or GitHub that runner groups of its
// namespace use.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:categories=runway
// +kubebuilder:printcolumn:name="Type",type=string,JSONPath=`.spec.type`
// +kubebuilder:printcolumn:name="URL",type=string,JSONPath=`.spec.url`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Forge struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ForgeSpec   `json:"spec"`
	Status ForgeStatus `json:"status,omitempty"`
}

// ForgeList is a list of Forges.
//
// +kubebuilder:object:root=true
type ForgeList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Forge `json:"items"`
}
