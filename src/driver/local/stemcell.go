package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/storage"
)

type stemcellRecord struct {
	CID        string            `json:"cid"`
	CloudProps driver.Props      `json:"cloud_properties"`
	Tags       map[string]string `json:"tags"`
	Source     string            `json:"source"`
	CreatedAt  string            `json:"created_at"`
}

// stemcellProps: what stemcell.MF files carry in cloud_properties,
// recorded; the local driver reads persistent_disks only: "bind" (the
// default: a warden stemcell's agent binds /warden-cpi-dev/<disk>) or
// "mount_service" (its agent mounts the disk itself; mountservice.go).
type stemcellProps struct {
	driver.StemcellManifest
}

// diskMounts answers a stemcell's persistent_disks, checked.
func (p stemcellProps) diskMounts() (string, error) {
	switch v := p.PersistentDisks.(type) {
	case nil:
		return diskMountsBind, nil
	case string:
		if v == diskMountsBind || v == diskMountsService {
			return v, nil
		}
	}
	return "", driver.Invalid("stemcell cloud_properties.persistent_disks: %q is neither %q nor %q", fmt.Sprint(p.PersistentDisks), diskMountsBind, diskMountsService)
}

// diskMountsOf answers how VMs of stemcell cid take their disks.
func (d *Driver) diskMountsOf(cid string) (string, error) {
	rec, err := load[stemcellRecord](d, stemcells, cid)
	if err != nil {
		return "", err
	}
	var props stemcellProps
	if err := rec.CloudProps.Decode("stemcell cloud_properties", &props); err != nil {
		return "", err
	}
	return props.diskMounts()
}

// CreateStemcell implements driver.Driver: the image tarball (tar or
// tar.gz) is unpacked into stemcells/<cid>/image.
func (d *Driver) CreateStemcell(ctx context.Context, spec driver.StemcellSpec) (string, error) {
	var props stemcellProps
	if err := spec.CloudProps.Decode("stemcell cloud_properties", &props); err != nil {
		return "", err
	}
	if _, err := props.diskMounts(); err != nil {
		return "", err
	}
	if spec.ImagePath == "" || !filepath.IsAbs(spec.ImagePath) {
		return "", driver.Invalid("image_path must be an absolute path, got %q", spec.ImagePath)
	}
	// A FIFO or a device would block (or never end) the read.
	if st, err := os.Stat(spec.ImagePath); err != nil {
		return "", driver.Invalid("image_path %s: %v", spec.ImagePath, unwrapPathErr(err))
	} else if !st.Mode().IsRegular() {
		return "", driver.Invalid("image_path %s is not a regular file (%s)", spec.ImagePath, st.Mode().Type())
	}
	cid, err := newCID("sc-")
	if err != nil {
		return "", err
	}
	unlock, err := d.lock(ctx, stemcells, cid)
	if err != nil {
		return "", err
	}
	defer unlock()
	tmp, err := d.stage(stemcells, cid, "image")
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) { _ = os.RemoveAll(tmp); return "", err }
	budget, err := storage.NewBudget(d.root, int64(d.cfg.MaxImageMiB)<<20, d.cfg.MaxImageEntries)
	if err != nil {
		return fail(err)
	}
	if err := storage.Untar(ctx, spec.ImagePath, filepath.Join(tmp, "image"), budget, d.containers()); err != nil {
		return fail(fmt.Errorf("unpacking stemcell image %s: %w", spec.ImagePath, err))
	}
	rec := stemcellRecord{CID: cid, CloudProps: spec.CloudProps, Tags: spec.Tags, Source: spec.ImagePath, CreatedAt: now()}
	if err := d.publish(stemcells, cid, tmp, rec); err != nil {
		return "", err
	}
	return cid, nil
}

// DeleteStemcell implements driver.Driver; a stemcell already gone is not
// an error (bosh-cli and the Director both expect that).
func (d *Driver) DeleteStemcell(ctx context.Context, cid string) error {
	return d.removeIfPresent(ctx, stemcells, cid)
}
