// Package v1alpha1 is seed 001's resource, unchanged: gitea-runner-
// operator's RunnerGroup (group gitea.bpg.pw, version v1alpha1), so a
// manifest written for that operator applies and works with Runway's
// controller. Its fields are the seed specification's (gitea.url, the
// tokens as secretRef.name/secretRef.key) and, where the operator's own
// CRD spells them otherwise, the operator's too (giteaURL, the tokens as
// name/key): either form is accepted, and each field's description says
// what Runway does with it.
//
// +kubebuilder:object:generate=true
// +groupName=gitea.bpg.pw
package v1alpha1
