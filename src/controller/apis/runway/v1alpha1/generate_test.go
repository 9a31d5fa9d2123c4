package v1alpha1

import (
	"os/exec"
	"testing"
)

// The deepcopy code of both API packages and the chart's CRDs are what
// controller-gen makes of the types today (scripts/crds -check).
func TestGeneratedCodeAndCRDsAreCurrent(t *testing.T) {
	cmd := exec.Command("../../../../../scripts/crds", "-check")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/crds -check: %v\n%s", err, out)
	}
}
