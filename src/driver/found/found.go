// Package found is how a driver's Has* methods answer from reading the
// resource: gone is no error, as the Director expects of has_vm and
// has_disk.
package found

import "errors"

// Answer is what a Has* method answers after a read that failed with err:
// false and no error when err wraps gone (the driver's not-found
// sentinel), true when the read succeeded, else the read's error.
func Answer(err, gone error) (bool, error) {
	if errors.Is(err, gone) {
		return false, nil
	}
	return err == nil, err
}
