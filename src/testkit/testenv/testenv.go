// Package testenv is how a test asks for what only the environment can
// give it (a cloud's endpoint, credentials). Missing, the test skips on a
// developer's machine; under scripts/test (RUNWAY_TEST_REQUIRE_ENV=1) it
// fails, because there a skip would pass a run that tested nothing.
package testenv

import (
	"os"
	"testing"
)

// RequireVar is set by scripts/test.
const RequireVar = "RUNWAY_TEST_REQUIRE_ENV"

// Need returns the values of the variables names, all set, or ends the
// test: a skip, or under RequireVar a failure naming what is missing and
// how to provide it (hint).
func Need(t testing.TB, hint string, names ...string) []string {
	t.Helper()
	out := make([]string, len(names))
	var missing []string
	for i, n := range names {
		out[i] = os.Getenv(n)
		if out[i] == "" {
			missing = append(missing, n)
		}
	}
	if len(missing) > 0 {
		if os.Getenv(RequireVar) == "1" {
			t.Fatalf("%v not set (%s); %s=1 requires every environment-dependent test to run", missing, hint, RequireVar)
		}
		t.Skipf("%v not set (%s)", missing, hint)
	}
	return out
}
