package garm

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/cloudbase/garm-provider-common/cloudconfig"
	"github.com/cloudbase/garm-provider-common/params"

	"github.com/runway-cpi/runway/src/driver/catalog"
)

func (p *provider) create(ctx context.Context, bi params.BootstrapInstance) (string, error) {
	if bi.Name == "" {
		return "", errors.New("bootstrap params have no instance name")
	}
	if p.env.PoolID == "" && bi.PoolID == "" {
		return "", errors.New("GARM_POOL_ID is not set")
	}
	pool := p.env.PoolID
	if pool == "" {
		pool = bi.PoolID
	}
	// One CreateInstance per name at a time, so a retried create finds the
	// first one's VM instead of making a second.
	release, err := p.sess.Locker.Lock(ctx, "garm-"+nameKey(p.env.ControllerID, bi.Name))
	if err != nil {
		return "", err
	}
	defer release()
	if existing, err := p.find(ctx, bi.Name); err != nil {
		return "", err
	} else if len(existing) > 0 {
		p.log.Info("instance exists: returning it", "instance", bi.Name, "vm", existing[0].CID)
		return marshal(instance(existing[0]))
	}

	specs, err := parseExtraSpecs(bi.ExtraSpecs)
	if err != nil {
		return "", err
	}
	if p.env.ExtraSpecs != "" {
		raw, err := base64.StdEncoding.DecodeString(p.env.ExtraSpecs)
		if err != nil {
			return "", fmt.Errorf("GARM_POOL_EXTRASPECS is not base64: %w", err)
		}
		if specs, err = parseExtraSpecs(raw); err != nil {
			return "", err
		}
	}
	stemcell, props, err := p.resolve(ctx, bi.Image, bi.Flavor, specs)
	if err != nil {
		return "", err
	}
	userData := specs.UserData
	if userData == "" {
		if userData, err = p.userData(bi); err != nil {
			return "", err
		}
	}
	nets := p.garm.Networks
	if len(specs.Networks) > 0 {
		nets = specs.Networks
	}
	tags := map[string]string{TagController: p.env.ControllerID, TagPool: pool, TagName: bi.Name,
		TagOSType: string(bi.OSType), TagOSArch: string(bi.OSArch)}
	env := map[string]any{"bosh": map[string]any{"tags": tags}, "user_data": userData}

	if _, werr := p.call(ctx, "create_vm", bi.Name, stemcell, props, nets, []string{}, env); werr != nil {
		// Leave nothing behind: whatever carries this name goes.
		if derr := p.delete(context.WithoutCancel(ctx), bi.Name); derr != nil {
			p.log.Error("cleaning up after a failed create failed", "instance", bi.Name, "err", derr)
		}
		return "", werr
	}
	found, err := p.find(ctx, bi.Name)
	if err != nil || len(found) == 0 {
		return "", fmt.Errorf("instance %s vanished right after creation: %v", bi.Name, err)
	}
	return marshal(instance(found[0]))
}

// resolve picks the stemcell and merges cloud properties: base, image,
// flavor, extra specs (later wins).
func (p *provider) resolve(ctx context.Context, image, flavor string, specs *ExtraSpecs) (string, props, error) {
	merged := props{}
	merge := func(m props) {
		for k, v := range m {
			merged[k] = v
		}
	}
	merge(p.garm.CloudProperties)
	stemcell := p.garm.Stemcell
	if img, ok := p.garm.Images[image]; ok {
		stemcell = img.Stemcell
		merge(img.CloudProperties)
	} else if len(p.garm.Images) > 0 && image != "" {
		return "", nil, fmt.Errorf("image %q has no mapping in the garm section of %s", image, p.env.ConfigFile)
	}
	if fl, ok := p.garm.Flavors[flavor]; ok {
		merge(fl)
	} else if len(p.garm.Flavors) > 0 && flavor != "" {
		return "", nil, fmt.Errorf("flavor %q has no mapping in the garm section of %s", flavor, p.env.ConfigFile)
	}
	merge(specs.CloudProperties)
	if specs.Stemcell != "" {
		stemcell = specs.Stemcell
	}
	if stemcell == "" {
		if p.cfg.Driver != "local" {
			return "", nil, fmt.Errorf("no stemcell for image %q: map it in the garm section of %s", image, p.env.ConfigFile)
		}
		var err error
		if stemcell, err = p.localStemcell(ctx); err != nil {
			return "", nil, err
		}
	}
	return stemcell, merged, nil
}

// localStemcell makes (once, under a lock) the empty stemcell local VMs
// need when no image is mapped.
func (p *provider) localStemcell(ctx context.Context) (string, error) {
	release, err := p.sess.Locker.Lock(ctx, "garm-local-stemcell")
	if err != nil {
		return "", err
	}
	defer release()
	record := filepath.Join(p.cfg.StateDir, "garm-local-stemcell")
	if b, err := os.ReadFile(record); err == nil {
		cid := strings.TrimSpace(string(b))
		if _, err := os.Stat(filepath.Join(p.cfg.StateDir, "stemcells", cid)); err == nil {
			return cid, nil
		}
	}
	dir, err := os.MkdirTemp(p.cfg.StateDir, ".garm-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	body := []byte("runway garm local stemcell: runners run on the host\n")
	_ = tw.WriteHeader(&tar.Header{Name: "README", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
	_, _ = tw.Write(body)
	_ = tw.Close()
	image := filepath.Join(dir, "image")
	if err := os.WriteFile(image, buf.Bytes(), 0o600); err != nil {
		return "", err
	}
	res, werr := p.call(ctx, "create_stemcell", image, map[string]any{})
	if werr != nil {
		return "", werr
	}
	cid, _ := res.(string)
	return cid, os.WriteFile(record, []byte(cid+"\n"), 0o600)
}

// userData renders garm's runner install: where the VM runs its user data
// as its process (local, kubernetes) the install script itself; elsewhere
// cloud-init (Linux) or the PowerShell user data (Windows) the images
// expect.
func (p *provider) userData(bi params.BootstrapInstance) (string, error) {
	tools, err := getTools(bi.OSType, bi.OSArch, bi.Tools)
	if err != nil {
		return "", err
	}
	if row, _ := catalog.Lookup(p.cfg.Driver); row.ScriptUserData && bi.OSType != params.Windows {
		script, err := cloudconfig.GetRunnerInstallScript(bi, tools, bi.Name)
		return string(script), err
	}
	return cloudconfig.GetCloudConfig(bi, tools, bi.Name)
}

// getTools picks the runner download for the instance's OS and arch,
// accepting garm's and GitHub's spellings (x64/amd64, win/windows).
func getTools(osType params.OSType, arch params.OSArch, tools []params.RunnerApplicationDownload) (params.RunnerApplicationDownload, error) {
	ghArch := map[params.OSArch]string{params.Amd64: "x64", params.Arm: "arm", params.Arm64: "arm64"}[arch]
	ghOS := map[params.OSType]string{params.Linux: "linux", params.Windows: "win"}[osType]
	if ghArch == "" || ghOS == "" {
		return params.RunnerApplicationDownload{}, fmt.Errorf("unsupported os_type/arch %q/%q (linux or windows; amd64, arm or arm64)", osType, arch)
	}
	for _, t := range tools {
		if (t.GetOS() == ghOS || t.GetOS() == string(osType)) && (t.GetArchitecture() == ghArch || t.GetArchitecture() == string(arch)) {
			return t, nil
		}
	}
	return params.RunnerApplicationDownload{}, fmt.Errorf("bootstrap params carry no runner tools for %s/%s", osType, arch)
}

// nameKey makes a lock name from any instance name.
func nameKey(controller, name string) string {
	sum := sha256.Sum256([]byte(controller + "\x00" + name))
	return hex.EncodeToString(sum[:12])
}
