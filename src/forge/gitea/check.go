package gitea

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"github.com/runway-cpi/runway/src/forge"
)

// Check implements forge.Checker: every endpoint a group of scope s uses,
// in the order a runner's life uses them. The finished-job lookup goes to
// a repository that does not exist: Gitea checks the token's scope before
// it looks the repository up, so 404 means allowed and 403 names the
// missing scope.
func (c *Client) Check(ctx context.Context, s forge.Scope) error {
	sc, err := scopeOf(s)
	if err != nil {
		return err
	}
	base := sc.path
	owner := s.Owner
	if owner == "" {
		owner = "runway"
	}
	var errs []error
	note := func(what string, err error) {
		if err != nil {
			errs = append(errs, scopeError(what, err))
		}
	}
	_, err = c.Jobs(ctx, s)
	note("list queued jobs (GET "+base+"/actions/jobs)", err)
	_, err = c.Runners(ctx, s)
	note("list runners (GET "+base+"/actions/runners)", err)
	_, err = c.registrationToken(ctx, sc)
	note("get a runner registration token (POST "+base+"/actions/runners/registration-token)", err)
	_, err = c.Job(ctx, forge.Job{ID: 0, Repo: owner + "/runway-scope-check"})
	if !errors.Is(err, forge.ErrNotFound) {
		note("check a finished job (GET /repos/{owner}/{repo}/actions/jobs/{id})", err)
	}
	return errors.Join(errs...)
}

// required is Gitea's list of acceptable scopes in a 403's message:
// "token does not have at least one of required scope(s), required=[read:repository], token scope=write:organization".
// Only scope names are taken from it: the answer is the forge's words
// (forge.Brief leaves them out where the URL's author reads them).
var required = regexp.MustCompile(`required=\[([a-z:_ ,-]{1,200})\]`)

func scopeError(what string, err error) error {
	var ae *forge.APIError
	if errors.As(err, &ae) {
		switch m := required.FindStringSubmatch(ae.Message); {
		case ae.Status == 403 && m != nil:
			return fmt.Errorf("%s: the token lacks the scope %s (Gitea: %w)", what, strings.ReplaceAll(m[1], " ", " or "), err)
		case ae.Status == 401:
			return fmt.Errorf("%s: Gitea refuses the token (%w)", what, err)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}
