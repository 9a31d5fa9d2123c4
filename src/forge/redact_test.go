package forge_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/forgejo"
	"github.com/runway-cpi/runway/src/forge/gitea"
	"github.com/runway-cpi/runway/src/forge/github"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// Every client's errors name a forge URL without its user info or query
// values — a transport error carries the whole request URL, go-github's
// its base URL — and keep the path that says where the request went.
func TestClientErrorsCarryNoURLSecrets(t *testing.T) {
	withQuery := forgetest.CanaryURL(t) // every request fails in the transport
	noQuery, _, _ := strings.Cut(withQuery, "?")
	scope := forge.Scope{Kind: "org", Owner: "acme"}
	for _, base := range []string{withQuery, noQuery} {
		tr := forge.NewTransport(func() string { return "token t" })
		tr.Retry.Budget = time.Second
		calls := map[string]func(ctx context.Context) error{
			"gitea jobs":    func(ctx context.Context) error { _, err := gitea.New(base, tr).Jobs(ctx, scope); return err },
			"gitea runners": func(ctx context.Context) error { _, err := gitea.New(base, tr).Runners(ctx, scope); return err },
			"gitea register": func(ctx context.Context) error {
				_, err := gitea.New(base, tr).Register(ctx, scope, "r", nil)
				return err
			},
			"forgejo jobs": func(ctx context.Context) error { _, err := forgejo.New(base, tr).Jobs(ctx, scope); return err },
			"github jobs": func(ctx context.Context) error {
				c, err := github.New(base, tr)
				if err != nil {
					return err
				}
				_, err = c.Jobs(ctx, scope)
				return err
			},
		}
		for name, call := range calls {
			err := call(context.Background())
			if err == nil {
				t.Fatalf("%s at %s: no error", name, base)
			}
			if msg := err.Error(); strings.Contains(msg, "canary") || !strings.Contains(msg, "keep-this-segment") {
				t.Errorf("%s at %s: %q", name, base, msg)
			}
			if strings.Contains(base, "?") {
				continue // go-github refuses that base before any request
			}
			// Redacted, the error is still what it was.
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := call(ctx); !errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "canary") {
				t.Errorf("%s at %s, cancelled: %v (want context.Canceled, redacted)", name, base, err)
			}
		}
	}
}
