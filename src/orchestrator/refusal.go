package orchestrator

import (
	"fmt"

	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// IdentityError is a change Replace refuses: what a group's runners were
// made with (its forge, scope, CPI) or a forge's type, while they exist.
// It is a config.FieldError too (errors.As), with the list and index of
// the group or forge at fault.
type IdentityError struct{ config.FieldError }

func (e *IdentityError) Unwrap() error { return &e.FieldError }

// identityError refuses a change to field of list's i-th item.
func identityError(list string, i int, field, msg string) *IdentityError {
	return &IdentityError{config.FieldError{Field: fmt.Sprintf("%s[%d].%s", list, i, field), Msg: msg, List: list, Index: i}}
}
