package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// SchemeGroupVersion is runway.io/v1alpha1.
var SchemeGroupVersion = schema.GroupVersion{Group: "runway.io", Version: "v1alpha1"}

// The resources.
var (
	ForgeResource       = SchemeGroupVersion.WithResource("forges")
	RunnerGroupResource = SchemeGroupVersion.WithResource("runnergroups")
)

var (
	schemeBuilder = runtime.NewSchemeBuilder(func(s *runtime.Scheme) error {
		s.AddKnownTypes(SchemeGroupVersion, &Forge{}, &ForgeList{}, &RunnerGroup{}, &RunnerGroupList{})
		metav1.AddToGroupVersion(s, SchemeGroupVersion)
		return nil
	})
	// AddToScheme adds the kinds to a scheme.
	AddToScheme = schemeBuilder.AddToScheme
)
