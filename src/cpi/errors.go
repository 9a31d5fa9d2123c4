package cpi

import (
	"context"
	"errors"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/retry"
	"github.com/runway-cpi/runway/src/rpc"
)

// Typed BOSH errors, constructed where the Director expects each one.
func CloudError(format string, a ...any) *rpc.Error {
	return rpc.NewError(rpc.TypeCloudError, false, format, a...)
}
func CpiError(format string, a ...any) *rpc.Error {
	return rpc.NewError(rpc.TypeCpiError, false, format, a...)
}
func NotImplemented(format string, a ...any) *rpc.Error {
	return rpc.NewError(rpc.TypeNotImplemented, false, format, a...)
}
func NotSupported(format string, a ...any) *rpc.Error {
	return rpc.NewError(rpc.TypeNotSupported, false, format, a...)
}
func VMNotFound(format string, a ...any) *rpc.Error {
	return rpc.NewError(rpc.TypeVMNotFound, false, format, a...)
}
func DiskNotFound(format string, a ...any) *rpc.Error {
	return rpc.NewError(rpc.TypeDiskNotFound, false, format, a...)
}
func DiskNotAttached(format string, a ...any) *rpc.Error {
	return rpc.NewError(rpc.TypeDiskNotAttached, false, format, a...)
}
func VMCreationFailed(okToRetry bool, format string, a ...any) *rpc.Error {
	return rpc.NewError(rpc.TypeVMCreationFailed, okToRetry, format, a...)
}
func NoDiskSpace(format string, a ...any) *rpc.Error {
	return rpc.NewError(rpc.TypeNoDiskSpace, true, format, a...)
}

// toWire maps a driver error to the BOSH type the caller expects for method.
func toWire(method string, err error) *rpc.Error {
	var we *rpc.Error
	if errors.As(err, &we) {
		return we
	}
	msg := err.Error()
	var ce *driver.CreationError
	switch {
	case errors.Is(err, driver.ErrInvalidInput):
		return CpiError("%s: %s", method, msg)
	case errors.As(err, &ce):
		return VMCreationFailed(ce.Retryable, "%s", msg)
	case errors.Is(err, driver.ErrVMNotFound):
		return VMNotFound("%s", msg)
	case errors.Is(err, driver.ErrDiskNotFound):
		return DiskNotFound("%s", msg)
	case errors.Is(err, driver.ErrDiskNotAttached):
		return DiskNotAttached("%s", msg)
	case errors.Is(err, driver.ErrNotSupported):
		return NotSupported("%s", msg)
	case errors.Is(err, driver.ErrNotImplemented):
		return NotImplemented("%s", msg)
	case errors.Is(err, driver.ErrNoDiskSpace):
		return NoDiskSpace("%s", msg)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, retry.ErrBudgetExhausted):
		if method == "create_vm" {
			return VMCreationFailed(true, "%s", msg)
		}
	}
	return CloudError("%s", msg)
}
