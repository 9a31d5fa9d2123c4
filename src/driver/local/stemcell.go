package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// CreateStemcell implements driver.Driver: the image tarball (tar or
// tar.gz) is unpacked into stemcells/<cid>/image.
func (d *Driver) CreateStemcell(ctx context.Context, spec driver.StemcellSpec) (string, error) {
	var props store.StemcellProps
	if err := spec.CloudProps.Decode("stemcell cloud_properties", &props); err != nil {
		return "", err
	}
	if _, err := props.DiskMounts(); err != nil {
		return "", err
	}
	if spec.ImagePath == "" || !filepath.IsAbs(spec.ImagePath) {
		return "", driver.Invalid("image_path must be an absolute path, got %q", spec.ImagePath)
	}
	// A FIFO or a device would block (or never end) the read.
	if st, err := os.Stat(spec.ImagePath); err != nil {
		return "", driver.Invalid("image_path %s: %v", spec.ImagePath, config.PathErrCause(err))
	} else if !st.Mode().IsRegular() {
		return "", driver.Invalid("image_path %s is not a regular file (%s)", spec.ImagePath, st.Mode().Type())
	}
	cid, unlock, err := d.st.LockNew(ctx, store.Stemcells, "sc-")
	if err != nil {
		return "", err
	}
	defer unlock()
	tmp, err := d.st.Stage(store.Stemcells, cid, "image")
	if err != nil {
		return "", err
	}
	fail := func(err error) (string, error) { _ = os.RemoveAll(tmp); return "", err }
	budget, err := storage.NewBudget(d.st.Root, int64(d.cfg.MaxImageMiB)<<20, d.cfg.MaxImageEntries)
	if err != nil {
		return fail(err)
	}
	if err := storage.Untar(ctx, spec.ImagePath, filepath.Join(tmp, "image"), budget, d.iso.ImageIsRootfs()); err != nil {
		return fail(fmt.Errorf("unpacking stemcell image %s: %w", spec.ImagePath, err))
	}
	rec := store.Stemcell{CID: cid, CloudProps: spec.CloudProps, Tags: spec.Tags, Source: spec.ImagePath, CreatedAt: store.Now()}
	if err := d.st.Publish(store.Stemcells, cid, tmp, rec); err != nil {
		return "", err
	}
	return cid, nil
}

// DeleteStemcell implements driver.Driver; a stemcell already gone is not
// an error (bosh-cli and the Director both expect that).
func (d *Driver) DeleteStemcell(ctx context.Context, cid string) error {
	return d.st.RemoveIfPresent(ctx, store.Stemcells, cid)
}
