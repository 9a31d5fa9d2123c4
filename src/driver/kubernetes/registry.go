package kubernetes

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path"
	"runtime"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/agentprofile"
	"github.com/runway-cpi/runway/src/driver/stemcellmf"
)

// RegistryConfig is where heavy stemcells go: each is pushed as a
// one-layer image, which delete_stemcell deletes again.
type RegistryConfig struct {
	// Repository the images are pushed to, e.g.
	// registry.example.com/bosh/stemcells; nodes pull from it too.
	Repository string `json:"repository"`
	// Insecure speaks plain HTTP (a registry on a trusted network).
	Insecure bool `json:"insecure,omitempty"`
	// Username and Password for the push and delete (basic or token
	// auth); pods pull with the VM type's image_pull_secrets.
	Username string `json:"username,omitempty"`
	Password string `json:"password,omitempty"`
}

func (r *RegistryConfig) repo() (name.Repository, error) {
	return name.NewRepository(r.Repository, nameOpts(r)...)
}

func (r *RegistryConfig) options(ctx context.Context) []remote.Option {
	auth := authn.Anonymous
	if r.Username != "" || r.Password != "" {
		auth = &authn.Basic{Username: r.Username, Password: r.Password}
	}
	return []remote.Option{remote.WithContext(ctx), remote.WithAuth(auth)}
}

// pushedPrefix starts the CID of a stemcell Runway pushed: the image's
// reference by digest follows, base64url.
const pushedPrefix = "push-"

// stemcellLabel is the label on a pushed image naming the push: two uploads
// of one tarball are two images, so deleting one never takes the other.
const stemcellLabel = "io.runway.stemcell"

// pushStemcell turns a rootfs tarball into an image in the registry and
// answers its reference by digest. The layer is written anew from the
// entries src/driver/tarcheck accepted, within max_image_mib and
// max_image_entries, stopping with ctx (cleanLayer).
func (d *Driver) pushStemcell(ctx context.Context, spec driver.StemcellSpec, m stemcellmf.Manifest) (string, error) {
	r := d.cfg.Registry
	repo, err := r.repo()
	if err != nil {
		return "", err
	}
	layer, err := cleanLayer(ctx, spec.ImagePath, d.cfg.imageLimits())
	if err != nil {
		return "", fmt.Errorf("stemcell image %s: %w", path.Base(spec.ImagePath), err)
	}
	defer os.Remove(layer.path)
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return "", err
	}
	id := make([]byte, 8)
	_, _ = rand.Read(id)
	cf, err := img.ConfigFile()
	if err != nil {
		return "", err
	}
	cf = cf.DeepCopy()
	// The runtime refuses an image with no platform.
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Labels = map[string]string{stemcellLabel: hex.EncodeToString(id)}
	if m.Name != nil {
		cf.Config.Labels[stemcellLabel+".name"] = fmt.Sprint(m.Name)
		cf.Config.Labels[stemcellLabel+".version"] = fmt.Sprint(m.Version)
	}
	if layer.hasAgent {
		// For a VM type with no command: the stemcell's agent, as warden starts it.
		cf.Config.Cmd = agentprofile.Boot
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return "", err
	}
	digest, err := img.Digest()
	if err != nil {
		return "", err
	}
	tag := repo.Tag("stemcell-" + hex.EncodeToString(id))
	if err := remote.Write(tag, img, r.options(ctx)...); err != nil {
		return "", registryErr("pushing the stemcell", err)
	}
	ref := repo.Digest(digest.String()).String()
	d.Log.Info("stemcell pushed", "image", ref, "tag", tag.TagStr())
	return ref, nil
}

// deletePushed deletes an image Runway pushed, after checking the CID's
// reference lies in the configured repository (a CID is input: it must not
// aim the registry credentials at anything else).
func (d *Driver) deletePushed(ctx context.Context, cid, ref string) error {
	r := d.cfg.Registry
	if r == nil {
		return driver.Invalid("stemcell %s was pushed to a registry, but kubernetes.registry is not configured", cid)
	}
	repo, err := r.repo()
	if err != nil {
		return err
	}
	dg, err := name.NewDigest(ref, nameOpts(r)...)
	if err != nil || dg.Context().String() != repo.String() {
		return driver.Invalid("stemcell cid %q names no image of kubernetes.registry.repository", cid)
	}
	err = remote.Delete(dg, r.options(ctx)...)
	var te *transport.Error
	if errors.As(err, &te) && te.StatusCode == http.StatusNotFound {
		return nil // gone already: delete_stemcell is idempotent
	}
	if err != nil {
		return registryErr("deleting the stemcell", err)
	}
	d.Log.Info("stemcell deleted from the registry", "image", ref)
	return nil
}

func nameOpts(r *RegistryConfig) []name.Option {
	if r.Insecure {
		return []name.Option{name.Insecure}
	}
	return nil
}

// registryErr keeps what the registry said, never a credential.
func registryErr(what string, err error) error {
	var te *transport.Error
	if errors.As(err, &te) {
		return fmt.Errorf("kubernetes.registry: %s: HTTP %d: %s", what, te.StatusCode, te.Error())
	}
	return fmt.Errorf("kubernetes.registry: %s: %w", what, err)
}
