package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// SchemeGroupVersion is gitea.bpg.pw/v1alpha1.
var SchemeGroupVersion = schema.GroupVersion{Group: "gitea.bpg.pw", Version: "v1alpha1"}

// Resource is runnergroups.gitea.bpg.pw.
var Resource = SchemeGroupVersion.WithResource("runnergroups")

var (
	schemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		s.AddKnownTypes(SchemeGroupVersion, &RunnerGroup{}, &RunnerGroupList{})
		metav1.AddToGroupVersion(s, SchemeGroupVersion)
		return nil
	})
	// AddToScheme adds the kinds to a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)
