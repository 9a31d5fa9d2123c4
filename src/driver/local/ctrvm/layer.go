package ctrvm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// A container VM writes to its own file system, an ext4 image of its
// ephemeral disk size (vms/<cid>/layer.img, every block allocated when it
// is made), mounted at run/<cid>/layer: the overlay's upper layer. A VM
// writing forever fills its image, not the state dir.

// layerImage is the VM's writable layer image.
func (c ctr) layerImage() string { return filepath.Join(c.dir, "layer.img") }

// ephemeralMiB is the size of a VM's writable layer: its cloud
// properties' ephemeral_disk_size, else the configured default.
func (v *VMs) ephemeralMiB(p store.VMProps) int {
	if p.EphemeralDiskSize > 0 {
		return p.EphemeralDiskSize
	}
	return v.cfg.DefaultEphemeralDiskMiB
}

// makeLayer makes a new VM's layer image, cloned from a template of that
// size (made once per size: a clone costs a few milliseconds, mkfs tens).
func (v *VMs) makeLayer(ctx context.Context, c ctr, sizeMiB int) error {
	if err := v.st.CheckSpace(sizeMiB); err != nil {
		return err
	}
	tmpl := filepath.Join(v.st.Root, "templates", "layer-"+strconv.Itoa(sizeMiB)+".img")
	if _, err := os.Stat(tmpl); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(filepath.Dir(tmpl), 0o700); err != nil {
			return err
		}
		// Made aside and renamed: two creators racing both succeed.
		tmp := tmpl + "." + c.cid
		_ = os.Remove(tmp)
		if err := storage.MakeImage(ctx, tmp, sizeMiB, storage.LayerImage, true); err != nil {
			return fmt.Errorf("making the writable layer's file system: %w", err)
		}
		if err := os.Rename(tmp, tmpl); err != nil {
			return err
		}
	}
	if err := storage.CloneImage(tmpl, c.layerImage(), sizeMiB); err != nil {
		return fmt.Errorf("the vm's writable layer: %w", err)
	}
	return nil
}

// mountLayer mounts the VM's writable layer at run/layer and makes its
// upper and work directories, the upper one owned and moded as the
// image's root is seen by the VM (the overlay's root takes them).
func (v *VMs) mountLayer(c ctr, run *os.Root, ids storage.IDRange, image string) error {
	if err := storage.MkdirOwned(run, "layer", 0o700, 0, 0); err != nil {
		return err
	}
	layer := filepath.Join(c.run(), "layer")
	if !storage.IsMountPoint(layer) {
		if err := storage.MountLoop(c.layerImage(), layer, unix.MS_NODEV, ""); err != nil {
			return fmt.Errorf("mounting the vm's writable layer: %w", err)
		}
	}
	for _, dir := range []string{"upper", "work"} {
		if err := os.Mkdir(filepath.Join(layer, dir), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	fi, err := os.Stat(image)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return driver.Invalid("the stemcell image has no owner")
	}
	upper := filepath.Join(layer, "upper")
	if err := os.Lchown(upper, int(ids.Base+st.Uid), int(ids.Base+st.Gid)); err != nil {
		return err
	}
	return os.Chmod(upper, fi.Mode()&(os.ModePerm|os.ModeSticky))
}
