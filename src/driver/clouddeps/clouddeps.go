// Package clouddeps is what every cloud driver keeps of the CPI's
// dependencies, built one way: the locker, a log tagged with the driver's
// name, and the CPI's retry policy classifying that cloud's errors.
package clouddeps

import (
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/retry"
)

// Base is embedded in each cloud driver's Driver.
type Base struct {
	Locks *lock.Locker
	Log   logging.Fields
	Retry retry.Policy
}

// New builds the base of the driver named tag: a nil logger discards, and
// the policy (retry.Policy.For) classifies with classify and logs its
// waits as the driver.
func New(tag string, locks *lock.Locker, logger logging.Logger, policy retry.Policy, classify retry.Classifier) Base {
	if logger == nil {
		logger = logging.Discard()
	}
	log := logging.Fields{Logger: logger, Tag: tag}
	return Base{Locks: locks, Log: log, Retry: policy.For(classify, log.Info)}
}
