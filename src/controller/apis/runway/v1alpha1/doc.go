// Package v1alpha1 is Runway's own API (group runway.io, version
// v1alpha1): a Forge (Gitea, Forgejo or GitHub: its URL, and its token
// and webhook secret by Secret reference) and a RunnerGroup with
// everything a group of runway.yml has. The CRDs in config/ are
// generated from these types (scripts/crds); the API server holds every
// object to their schema, defaults and rules.
//
// +kubebuilder:object:generate=true
// +groupName=runway.io
package v1alpha1
