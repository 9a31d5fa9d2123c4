package orchestrator

import (
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// A forge URL aimed at something else answers with its own words: the
// operator's status keeps them (LastError), the group author's does not
// (LastErrorBrief, which the Kubernetes controller writes on the
// object): only the request and its HTTP status.
func TestLastErrorBriefHasNothingTheForgeSaid(t *testing.T) {
	const marker = "metadata-credentials-6d0e"
	o, _ := startOnGitea(t, forgetest.Elsewhere(t, marker), "", `
  - {name: a, scope: org, org: acme, labels: [linux], max_active_runners: 1, stemcell: {cid: sc-1}, runner: {command: /bin/true}}`,
		&vmCPI{vms: map[string]map[string]any{}}, nil)
	eventually(t, 10*time.Second, "the forge's refusal in the status", func() bool {
		s, _ := statusOf(o, "a")
		return strings.Contains(s.LastError, marker)
	})
	s, _ := statusOf(o, "a")
	if strings.Contains(s.LastErrorBrief, marker) || !strings.Contains(s.LastErrorBrief, "HTTP 403") {
		t.Errorf("LastErrorBrief %q", s.LastErrorBrief)
	}
}
