package vsphere

import (
	"errors"
	"fmt"

	"github.com/vmware/govmomi/fault"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/vim25/types"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/retry"
)

// cloudErr names the operation and vCenter, and says plainly when vCenter
// throttled us until the wait budget ran out.
func (d *Driver) cloudErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var t *throttled
	if errors.As(err, &t) {
		return fmt.Errorf("vsphere %s: throttled by %s (%d) and still throttled after the wait budget: %w", op, d.cfg.hostName(), t.status, err)
	}
	if errors.Is(err, driver.ErrInvalidInput) || errors.Is(err, driver.ErrNotSupported) {
		return err
	}
	return fmt.Errorf("vsphere %s (%s): %w", op, d.cfg.hostName(), err)
}

// notFound reports a fault or finder error meaning the object is gone.
func notFound(err error) bool {
	var nf *find.NotFoundError
	return errors.As(err, &nf) || fault.Is(err, &types.ManagedObjectNotFound{}) ||
		fault.Is(err, &types.FileNotFound{}) || fault.Is(err, &types.NotFound{})
}

// capacity reports faults a later attempt elsewhere can get past: the
// Director may retry create_vm on them (ok_to_retry).
func capacity(err error) bool {
	var t *throttled
	return errors.As(err, &t) || errors.Is(err, retry.ErrBudgetExhausted) || errors.Is(err, errNoPlacement) ||
		fault.Is(err, &types.InsufficientResourcesFault{}) || fault.Is(err, &types.NoDiskSpace{}) ||
		fault.Is(err, &types.InsufficientDisks{}) || fault.Is(err, &types.OutOfBounds{})
}

// errNoPlacement: no cluster and datastore fit the VM or disk.
var errNoPlacement = errors.New("no placement")
