package forge_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// What an address answers never comes back in Brief, however the error
// was wrapped: only the method, the URL and the status.
func TestBriefKeepsOnlyTheStatus(t *testing.T) {
	const marker = "kube-apiserver-reply-7f3a"
	err := forge.DoJSON(context.Background(), http.DefaultClient, "GET", forgetest.Elsewhere(t, marker)+"/api/v1/orgs/acme/actions/jobs", nil, nil)
	if err == nil || !strings.Contains(err.Error(), marker) {
		t.Fatalf("the full error should carry the answer (for the operator's log): %v", err)
	}
	var ae *forge.APIError
	errors.As(err, &ae)
	wrapped := errors.Join(fmt.Errorf("list queued jobs: %w", err),
		fmt.Errorf("get a token: quoted %s: %w", ae.Message, errors.New("refused")))
	for _, e := range []error{err, wrapped} {
		b := forge.Brief(e)
		if strings.Contains(b, marker) || !strings.Contains(b, "HTTP 403") || !strings.Contains(b, "/api/v1/orgs/acme/actions/jobs") {
			t.Errorf("Brief(%v) = %q", e, b)
		}
	}
	if forge.Brief(nil) != "" {
		t.Error("Brief(nil)")
	}
}
