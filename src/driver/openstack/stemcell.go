package openstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/imagedata"
	"github.com/gophercloud/gophercloud/v2/openstack/image/v2/images"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/cloudtags"
	"github.com/runway-cpi/runway/src/driver/stemcellimage"
)

// CreateStemcell uploads the stemcell's image into Glance and waits until
// it is active, or, for a light stemcell (cloud_properties.image_id),
// checks the image exists and answers "<id> light".
func (d *Driver) CreateStemcell(ctx context.Context, spec driver.StemcellSpec) (string, error) {
	var p stemcellProps
	if err := spec.CloudProps.Decode("cloud_properties", &p); err != nil {
		return "", err
	}
	if p.ImageID != "" {
		id, err := validCID("stemcell", p.ImageID)
		if err != nil {
			return "", err
		}
		img, err := d.image(ctx, id)
		if err != nil {
			return "", err
		}
		if img.Status != images.ImageStatusActive {
			return "", fmt.Errorf("openstack: light stemcell image %s is %s, not active", id, img.Status)
		}
		return id + " light", nil
	}
	if spec.ImagePath == "" {
		return "", driver.Invalid("image_path is required (or cloud_properties.image_id for a light stemcell)")
	}
	if _, err := os.Stat(spec.ImagePath); err != nil {
		return "", driver.Invalid("image_path: %v", err)
	}
	// The id is ours, so a resent create finds its image instead of making two.
	id := uuid.NewString()
	name := "stemcell-" + id
	props, err := p.imageProperties()
	if err != nil {
		return "", err
	}
	if p.Name != "" {
		name = p.Name + "/" + props["version"]
	}
	tags := cloudtags.Merge(p.Tags, spec.Tags)
	for k, v := range metadata(tags) {
		if _, reserved := props[k]; !reserved {
			props["runway_"+k] = v
		}
	}
	opts := images.CreateOpts{ID: id, Name: name, DiskFormat: firstNonEmpty(p.DiskFormat, "qcow2"),
		ContainerFormat: firstNonEmpty(p.ContainerFormat, "bare"), Tags: serverTags(tags), Properties: props}
	// Private unless stemcell_public_visibility, as the official CPI sets
	// it (Glance's own default is "shared").
	visibility := images.ImageVisibilityPrivate
	if d.cfg.StemcellPublicVisibility {
		visibility = images.ImageVisibilityPublic
	}
	opts.Visibility = &visibility
	_, err = d.do(ctx, "image", "create image "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		_, err := images.Create(ctx, sc, opts).Extract()
		if status(err) == 409 {
			return nil // made by an earlier attempt of this call
		}
		return err
	})
	if err != nil {
		return "", d.cloudErr("create image", err)
	}
	if err := d.upload(ctx, id, spec.ImagePath); err != nil {
		d.deleteImage(context.WithoutCancel(ctx), id)
		return "", err
	}
	d.Log.Info("stemcell image uploaded", "image", id, "name", name)
	return id, nil
}

// upload streams the image (the root image inside a tar.gz stemcell
// image, or the file itself) into Glance and waits until it is active.
func (d *Driver) upload(ctx context.Context, id, path string) error {
	// A 409 on a resent upload: the first one landed (the wait checks it).
	err := d.doOnce(ctx, "image", "upload image "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		r, closeFn, err := openImage(path)
		if err != nil {
			return err
		}
		defer closeFn()
		return imagedata.Upload(ctx, sc, id, r).ExtractErr()
	}, is409)
	if err != nil {
		if errors.Is(err, errBadImage) {
			return driver.Invalid("%v", err)
		}
		return d.cloudErr("upload image "+id, err)
	}
	return d.waitFor(ctx, "image "+id+" active", func(ctx context.Context) (bool, error) {
		img, err := d.image(ctx, id)
		if err != nil {
			return false, err
		}
		switch img.Status {
		case images.ImageStatusActive:
			return true, nil
		case images.ImageStatusKilled, images.ImageStatusDeleted:
			return false, fmt.Errorf("openstack: image %s went to %s after upload", id, img.Status)
		}
		return false, nil
	})
}

var errBadImage = errors.New("stemcell image")

// openImage returns the bytes to upload: the first file of a gzipped tar
// (BOSH's "image" holds root.img), a gzipped file unpacked, else the file.
func openImage(path string) (io.Reader, func(), error) {
	r, size, closeFn, err := stemcellimage.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errBadImage, err)
	}
	if size >= 0 { // not gzipped: the file itself
		return r, closeFn, nil
	}
	m, _, err := stemcellimage.Member(r, func(string) bool { return true })
	if err != nil {
		closeFn()
		return nil, nil, fmt.Errorf("%w %s: no image file in the archive: %v", errBadImage, path, err)
	}
	if m == nil {
		return r, closeFn, nil
	}
	return m, closeFn, nil
}

func (d *Driver) image(ctx context.Context, id string) (*images.Image, error) {
	return read(ctx, d, "image", "get image "+id, fmt.Errorf("openstack (%s): image %s not found: %w", d.cfg.AuthURL, id, driver.ErrStemcellNotFound),
		func(ctx context.Context, sc *gophercloud.ServiceClient) (*images.Image, error) {
			return images.Get(ctx, sc, id).Extract()
		})
}

// DeleteStemcell deletes an uploaded image; light stemcells and images
// already gone are not an error.
func (d *Driver) DeleteStemcell(ctx context.Context, cid string) error {
	id, err := validCID("stemcell", cid)
	if err != nil {
		return err
	}
	if id != cid { // light: the image is not ours
		return nil
	}
	_, err = d.do(ctx, "image", "delete image "+id, func(ctx context.Context, sc *gophercloud.ServiceClient) error {
		return images.Delete(ctx, sc, id).ExtractErr()
	})
	if err != nil && !isNotFound(err) {
		return d.cloudErr("delete image "+id, err)
	}
	return nil
}

func (d *Driver) deleteImage(ctx context.Context, id string) {
	if err := d.DeleteStemcell(ctx, id); err != nil {
		d.Log.Warn("deleting the image after a failed upload failed", "image", id, "err", err)
	}
}
