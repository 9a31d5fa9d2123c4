package openstack

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/blockstorage/v3/volumes"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/volumeattach"

	"github.com/runway-cpi/runway/src/driver"
)

// AttachDisk attaches through Nova under the VM's lock, waits until the
// volume is in-use on that server, and returns Nova's device as the hint.
func (d *Driver) AttachDisk(ctx context.Context, vmCID, diskCID string) (_ any, err error) {
	vm, err := validCID("vm", vmCID)
	if err != nil {
		return nil, err
	}
	disk, err := validCID("disk", diskCID)
	if err != nil {
		return nil, err
	}
	unlock, err := d.Locks.Lock(ctx, vmLock(vm))
	if err != nil {
		return nil, err
	}
	defer func() { d.Locks.Release(vmLock(vm), unlock, errors.Is(err, driver.ErrVMNotFound)) }()
	var a *volumeattach.VolumeAttachment
	_, err = d.do(ctx, "compute", "attach "+disk+" to "+vm, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		var err error
		a, err = volumeattach.Create(ctx, sc, vm, volumeattach.CreateOpts{VolumeID: disk}).Extract()
		return err
	})
	device := ""
	if err == nil {
		device = a.Device
	} else {
		// Already attached here (a resent request, or a second call)?
		v, verr := d.volume(ctx, disk)
		if verr != nil {
			return nil, verr
		}
		at := attachmentTo(v, vm)
		// A resent attach finds Nova or Cinder already at it; the wait
		// below proves the volume ends up on this server.
		resent := status(err) == 400 && strings.Contains(apiMessage(err), vm) ||
			v.Status == "attaching" || v.Status == "reserved"
		if at == nil && !resent {
			if isNotFound(err) {
				if _, serr := d.server(ctx, vm); serr != nil {
					return nil, serr
				}
			}
			return nil, d.cloudErr("attach volume "+disk+" to server "+vm, err)
		}
		if at != nil {
			device = at.Device
		}
	}
	if err := d.waitFor(ctx, "volume "+disk+" in-use on "+vm, func(ctx context.Context) (bool, error) {
		v, err := d.volume(ctx, disk)
		if err != nil {
			return false, err
		}
		at := attachmentTo(v, vm)
		switch {
		case strings.HasPrefix(v.Status, "error"):
			return false, fmt.Errorf("openstack: volume %s went to %s while attaching to %s", disk, v.Status, vm)
		case v.Status == "available" || v.Status == "in-use" && at == nil:
			return false, fmt.Errorf("openstack: volume %s did not attach to server %s (status %s)", disk, vm, v.Status)
		case v.Status == "in-use":
			if at.Device != "" {
				device = at.Device
			}
			return true, nil
		}
		return false, nil
	}); err != nil {
		return nil, err
	}
	d.Log.Info("attached", "volume", disk, "server", vm, "device", device)
	if device == "" {
		return map[string]any{"id": disk}, nil
	}
	return device, nil
}

func attachmentTo(v *volumes.Volume, server string) *volumes.Attachment {
	for i := range v.Attachments {
		if v.Attachments[i].ServerID == server {
			return &v.Attachments[i]
		}
	}
	return nil
}

// DetachDisk detaches through Nova under the VM's lock and waits until
// the volume is available.
func (d *Driver) DetachDisk(ctx context.Context, vmCID, diskCID string) (err error) {
	vm, err := validCID("vm", vmCID)
	if err != nil {
		return err
	}
	disk, err := validCID("disk", diskCID)
	if err != nil {
		return err
	}
	unlock, err := d.Locks.Lock(ctx, vmLock(vm))
	if err != nil {
		return err
	}
	defer func() { d.Locks.Release(vmLock(vm), unlock, errors.Is(err, driver.ErrVMNotFound)) }()
	// Read first: a 404 from a resent detach is then known to mean done.
	v, err := d.volume(ctx, disk)
	if err != nil {
		return err
	}
	if attachmentTo(v, vm) == nil && v.Status != "detaching" {
		if _, err := d.server(ctx, vm); err != nil {
			return err
		}
		return fmt.Errorf("volume %s is not attached to server %s: %w", disk, vm, driver.ErrDiskNotAttached)
	}
	// A resent detach meets the volume detaching (400) or detached (404).
	err = d.doOnce(ctx, "compute", "detach "+disk+" from "+vm, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		return volumeattach.Delete(ctx, sc, vm, disk).ExtractErr()
	}, func(err error) bool {
		if isNotFound(err) {
			return true
		}
		cur, verr := d.volume(ctx, disk)
		return status(err) == 400 && verr == nil && (cur.Status == "detaching" || attachmentTo(cur, vm) == nil)
	})
	if isNotFound(err) {
		if _, serr := d.server(ctx, vm); serr != nil {
			return serr
		}
		return fmt.Errorf("volume %s is not attached to server %s: %w", disk, vm, driver.ErrDiskNotAttached)
	}
	if err != nil {
		return d.cloudErr("detach volume "+disk+" from server "+vm, err)
	}
	if err := d.waitFor(ctx, "volume "+disk+" detached from "+vm, func(ctx context.Context) (bool, error) {
		v, err := d.volume(ctx, disk)
		if err != nil || attachmentTo(v, vm) != nil || v.Status == "detaching" {
			return false, err
		}
		// Nova drops its block-device mapping only after Cinder shows the
		// volume free: wait for both, so get_disks agrees at once.
		_, err = d.do(ctx, "compute", "get attachment of "+disk+" to "+vm, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
			_, err := volumeattach.Get(ctx, sc, vm, disk).Extract()
			return err
		})
		if isNotFound(err) {
			return true, nil
		}
		return false, err
	}); err != nil {
		return err
	}
	d.Log.Info("detached", "volume", disk, "server", vm)
	return nil
}

// GetDisks lists the volumes attached to a server, without its root disk.
func (d *Driver) GetDisks(ctx context.Context, vmCID string) ([]string, error) {
	vm, err := validCID("vm", vmCID)
	if err != nil {
		return nil, err
	}
	list, err := read(ctx, d, "compute", "list attachments of "+vm, fmt.Errorf("server %s: %w", vm, driver.ErrVMNotFound),
		func(ctx context.Context, sc *gophercloud.ServiceClient) ([]volumeattach.VolumeAttachment, error) {
			return all(ctx, volumeattach.List(sc, vm), volumeattach.ExtractVolumeAttachments)
		})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, a := range list {
		if !rootDevice(a.Device) {
			out = append(out, a.VolumeID)
		}
	}
	return out, nil
}

// rootDevice: the boot volume of a boot-from-volume server.
func rootDevice(dev string) bool {
	return dev == "/dev/vda" || dev == "/dev/sda" || dev == "/dev/xvda" || dev == "/dev/hda"
}
