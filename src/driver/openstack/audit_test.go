//go:build audit

package openstack

import (
	"testing"

	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// TestAudit is run by scripts/it-openstack (go test -tags audit) after the
// lifecycle suites: nothing the suites' director created may exist
// anywhere in the cloud.
func TestAudit(t *testing.T) {
	director := testenv.Need(t, "scripts/it-openstack sets it", "RUNWAY_OS_AUDIT_DIRECTOR")[0]
	assertNoneTagged(t, devCloud(t), "director", director)
}
