package kubernetes

import (
	"archive/tar"
	"bufio"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/runway-cpi/runway/src/driver"
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
// entries it checked: no name leaves the root, no hard link points out,
// device nodes and FIFOs are dropped (the runtime makes /dev).
func (d *Driver) pushStemcell(ctx context.Context, spec driver.StemcellSpec, m driver.StemcellManifest) (string, error) {
	r := d.cfg.Registry
	repo, err := r.repo()
	if err != nil {
		return "", err
	}
	layerPath, hasAgent, err := cleanLayer(spec.ImagePath)
	if err != nil {
		return "", driver.Invalid("stemcell image %s: %v", path.Base(spec.ImagePath), err)
	}
	defer os.Remove(layerPath)
	layer, err := tarball.LayerFromFile(layerPath)
	if err != nil {
		return "", err
	}
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
	if hasAgent {
		// For a VM type with no command: the stemcell's agent, as warden starts it.
		cf.Config.Cmd = driver.AgentBoot
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
	d.log.Info("stemcell pushed", "image", ref, "tag", tag.TagStr())
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
	d.log.Info("stemcell deleted from the registry", "image", ref)
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

// cleanLayer writes the entries of a rootfs tarball (gzip or plain) that
// may be a layer to a new gzip tarball, and says whether the stemcell has
// the agent's init.
func cleanLayer(src string) (string, bool, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", false, err
	}
	defer in.Close()
	br := bufio.NewReader(in)
	var r io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return "", false, err
		}
		defer gz.Close()
		r = gz
	}
	out, err := os.CreateTemp("", "runway-layer-*.tar.gz")
	if err != nil {
		return "", false, err
	}
	ok := false
	defer func() {
		out.Close()
		if !ok {
			os.Remove(out.Name())
		}
	}()
	zw, _ := gzip.NewWriterLevel(out, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	tr := tar.NewReader(r)
	entries, hasAgent := 0, false
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", false, fmt.Errorf("not a valid tar archive: %w", err)
		}
		entries++
		n, err := inRoot(h.Name)
		if err != nil {
			return "", false, err
		}
		switch h.Typeflag {
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			continue
		case tar.TypeLink:
			if _, err := inRoot(h.Linkname); err != nil {
				return "", false, fmt.Errorf("hard link %q: %w", h.Name, err)
			}
		case tar.TypeReg, tar.TypeDir, tar.TypeSymlink:
		default:
			return "", false, fmt.Errorf("entry %q: type %q is not a file, directory or link", h.Name, h.Typeflag)
		}
		if n == strings.TrimPrefix(driver.AgentInit, "/") {
			hasAgent = true
		}
		h.Name = n
		if h.Typeflag == tar.TypeDir {
			h.Name = n + "/"
		}
		if h.Typeflag == tar.TypeLink {
			h.Linkname, _ = inRoot(h.Linkname)
		}
		h.Format = tar.FormatPAX
		if err := tw.WriteHeader(h); err != nil {
			return "", false, err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return "", false, err
		}
	}
	if entries == 0 {
		return "", false, errors.New("not a valid tar archive: no entries")
	}
	if err := tw.Close(); err != nil {
		return "", false, err
	}
	if err := zw.Close(); err != nil {
		return "", false, err
	}
	ok = true
	return out.Name(), hasAgent, out.Close()
}

// inRoot is an entry name relative to the image's root, or an error when
// it would leave it.
func inRoot(p string) (string, error) {
	c := path.Clean(strings.TrimPrefix(p, "./"))
	if path.IsAbs(c) || c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("entry %q leaves the image's root", p)
	}
	return c, nil
}
