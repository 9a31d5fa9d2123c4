package store

import (
	"errors"
	"io/fs"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/lock"
)

// maxCIDLen keeps paths well under PATH_MAX and names under NAME_MAX.
const maxCIDLen = 128

// CheckCID validates a CID before it becomes a path component.
func CheckCID(kind, cid string) error {
	switch {
	case cid == "":
		return driver.Invalid("%s cid must not be empty", kind)
	case len(cid) > maxCIDLen:
		return driver.Invalid("%s cid is %d bytes long, at most %d allowed", kind, len(cid), maxCIDLen)
	case !lock.SafeName(cid):
		return driver.Invalid("%s cid %q may only hold letters, digits, '.', '_' and '-' and must not start with '.' (no paths)", kind, cid)
	}
	return nil
}

func isNotExist(err error) bool { return errors.Is(err, fs.ErrNotExist) }
