package openstack

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"

	"github.com/runway-cpi/runway/src/driver"
)

// RebootVM reboots softly, and hard when the soft reboot is refused or
// does not bring the server back within a few minutes.
func (d *Driver) RebootVM(ctx context.Context, cid string) error {
	id, err := validCID("vm", cid)
	if err != nil {
		return err
	}
	if _, err := d.server(ctx, id); err != nil {
		return err
	}
	err = d.reboot(ctx, id, servers.SoftReboot)
	if err == nil {
		sctx, cancel := context.WithTimeout(ctx, softRebootWait(d.cfg))
		_, err = d.waitServer(sctx, id, "ACTIVE")
		cancel()
		if err == nil {
			return nil
		}
	}
	if errors.Is(err, driver.ErrVMNotFound) || ctx.Err() != nil {
		return err
	}
	d.Log.Warn("soft reboot did not complete; rebooting hard", "server", id, "err", err)
	if err := d.reboot(ctx, id, servers.HardReboot); err != nil {
		return err
	}
	_, err = d.waitServer(ctx, id, "ACTIVE")
	return err
}

// softRebootWait: a guest that ignores ACPI gets this long, then a hard reboot.
func softRebootWait(c Config) time.Duration { return min(c.WaitTimeout()/3, 3*time.Minute) }

func (d *Driver) reboot(ctx context.Context, id string, how servers.RebootMethod) error {
	err := d.doOnce(ctx, "compute", fmt.Sprintf("%s reboot %s", how, id), func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		return servers.Reboot(ctx, sc, id, servers.RebootOpts{Type: how}).ExtractErr()
	}, is409)
	if isNotFound(err) {
		return fmt.Errorf("server %s: %w", id, driver.ErrVMNotFound)
	}
	if err != nil {
		return d.cloudErr(fmt.Sprintf("%s reboot %s", how, id), err)
	}
	return nil
}

// StopVM powers the server off and waits for SHUTOFF.
func (d *Driver) StopVM(ctx context.Context, cid string) error {
	return d.power(ctx, cid, "stop", "SHUTOFF", func(ctx context.Context, sc *gophercloud.ServiceClient, id string) error {
		return servers.Stop(ctx, sc, id).ExtractErr()
	})
}

// StartVM powers the server on and waits for ACTIVE.
func (d *Driver) StartVM(ctx context.Context, cid string) error {
	return d.power(ctx, cid, "start", "ACTIVE", func(ctx context.Context, sc *gophercloud.ServiceClient, id string) error {
		return servers.Start(ctx, sc, id).ExtractErr()
	})
}

func (d *Driver) power(ctx context.Context, cid, op, want string, fn func(context.Context, *gophercloud.ServiceClient, string) error) error {
	id, err := validCID("vm", cid)
	if err != nil {
		return err
	}
	s, err := d.server(ctx, id)
	if err != nil {
		return err
	}
	if s.Status == want {
		return nil
	}
	_, err = d.do(ctx, "compute", op+" server "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		err := fn(ctx, sc, id)
		if status(err) == 409 {
			// Already on its way (a resent request, or another caller).
			return nil
		}
		return err
	})
	if isNotFound(err) {
		return fmt.Errorf("server %s: %w", id, driver.ErrVMNotFound)
	}
	if err != nil {
		return d.cloudErr(op+" server "+id, err)
	}
	_, err = d.waitServer(ctx, id, want)
	return err
}
