package orchestrator

import (
	"errors"
	"fmt"
	"testing"

	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// Replace's identity refusals are read as the config's are: a
// config.FieldError with the list and index of the item at fault, and
// the same text as before.
func TestIdentityErrorIsAFieldError(t *testing.T) {
	err := fmt.Errorf("replace: %w", identityError("groups", 2, "repo", "cannot change"))
	var fe *config.FieldError
	if !errors.As(err, &fe) || fe.List != "groups" || fe.Index != 2 || fe.InItem() != "repo" {
		t.Errorf("%v: read as %+v", err, fe)
	}
	var ie *IdentityError
	if !errors.As(err, &ie) || ie.Field != "groups[2].repo" || ie.Error() != "groups[2].repo: cannot change" {
		t.Errorf("%v: read as %+v", err, ie)
	}
}
