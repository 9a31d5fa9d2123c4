package kubernetes

import (
	"context"
	"encoding/base64"
	"strings"

	"github.com/distribution/reference"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/catalog"
	"github.com/runway-cpi/runway/src/driver/stemcellmf"
)

// stemcellProps: a light stemcell names its image.
type stemcellProps struct {
	stemcellmf.Manifest
	Image string `json:"image"`
}

// StemcellFormats implements driver.Driver: heavy (rootfs) stemcells
// need a registry.
func (d *Driver) StemcellFormats() []string {
	row, _ := catalog.Lookup("kubernetes")
	if d.cfg.Registry != nil {
		return row.WithExtra()
	}
	return row.StemcellFormats
}

// stemcellPrefix starts a stemcell CID: the image reference follows,
// base64url, so the CID is all the driver needs (nothing is stored in the
// cluster, and no image of a light stemcell is ever deleted).
const stemcellPrefix = "img-"

// CreateStemcell implements driver.Driver: a light stemcell's image is
// checked as a reference (its pull is the kubelet's, at create_vm); a
// heavy one is pushed to the registry as an image.
func (d *Driver) CreateStemcell(ctx context.Context, spec driver.StemcellSpec) (string, error) {
	var p stemcellProps
	if err := spec.CloudProps.Decode("cloud_properties", &p); err != nil {
		return "", err
	}
	if p.Image == "" {
		if d.cfg.Registry == nil {
			return "", driver.Invalid("cloud_properties.image is not set: this stemcell is a rootfs tarball (heavy), which needs kubernetes.registry to become an image, and none is configured; use a light stemcell naming an image")
		}
		ref, err := d.pushStemcell(ctx, spec, p.Manifest)
		if err != nil {
			return "", err
		}
		return pushedPrefix + base64.RawURLEncoding.EncodeToString([]byte(ref)), nil
	}
	if _, err := reference.ParseAnyReference(p.Image); err != nil {
		return "", driver.Invalid("cloud_properties.image %q is not an image reference: %v", p.Image, err)
	}
	return stemcellPrefix + base64.RawURLEncoding.EncodeToString([]byte(p.Image)), nil
}

// DeleteStemcell implements driver.Driver: an image Runway pushed is
// deleted from the registry; a light stemcell's image is someone else's.
func (d *Driver) DeleteStemcell(ctx context.Context, cid string) error {
	ref, err := stemcellImage(cid)
	if err != nil || !strings.HasPrefix(cid, pushedPrefix) {
		return err
	}
	return d.deletePushed(ctx, cid, ref)
}

// stemcellImage is the image of a stemcell CID.
func stemcellImage(cid string) (string, error) {
	enc, ok := strings.CutPrefix(cid, stemcellPrefix)
	if !ok {
		enc, ok = strings.CutPrefix(cid, pushedPrefix)
	}
	if !ok {
		return "", driver.Invalid("stemcell cid %q is not one this driver makes (%s… or %s…)", cid, stemcellPrefix, pushedPrefix)
	}
	b, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil {
		return "", driver.Invalid("stemcell cid %q is not one this driver makes: %v", cid, err)
	}
	if _, err := reference.ParseAnyReference(string(b)); err != nil {
		return "", driver.Invalid("stemcell cid %q does not name an image: %v", cid, err)
	}
	return string(b), nil
}
