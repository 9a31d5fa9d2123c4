//go:build audit

package aws

import (
	"testing"

	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// TestAudit is run by scripts/it-aws (go test -tags audit) after the
// lifecycle suites: nothing the suites' director created may still exist
// on the server.
func TestAudit(t *testing.T) {
	director := testenv.Need(t, "scripts/it-aws sets it", "RUNWAY_AWS_AUDIT_DIRECTOR")[0]
	assertNoLeftovers(t, motoEndpoint(t), map[string]string{"director": director})
}
