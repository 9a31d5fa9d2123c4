package garm

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/cloudbase/garm-provider-common/cloudconfig"
	"github.com/cloudbase/garm-provider-common/params"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/cpi"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/rpc"
)

// Version is what GetVersion prints.
const Version = "v0.1.0"

// Tags every instance carries.
const (
	TagController = "garm-controller-id"
	TagPool       = "garm-pool-id"
	TagName       = "garm-instance-name"
	TagOSType     = "garm-os-type"
	TagOSArch     = "garm-os-arch"
)

// Interface versions and exit codes of garm's external provider contract.
// (Defined here rather than imported: garm-provider-common's execution and
// util packages pull in net/http, bcrypt and more, which every bin/cpi
// start would pay for.)
const (
	Version010       = "v0.1.0"
	Version011       = "v0.1.1"
	ExitCodeNotFound = 30
)

// errNotFound → exit 30.
var errNotFound = errors.New("instance not found")

// Env is what garm puts in the environment.
type Env struct {
	Command, ControllerID, PoolID, ConfigFile, InstanceID, InterfaceVersion, ExtraSpecs string
}

// EnvFrom reads the variables garm sets.
func EnvFrom(getenv func(string) string) Env {
	return Env{Command: getenv("GARM_COMMAND"), ControllerID: getenv("GARM_CONTROLLER_ID"), PoolID: getenv("GARM_POOL_ID"),
		ConfigFile: getenv("GARM_PROVIDER_CONFIG_FILE"), InstanceID: getenv("GARM_INSTANCE_ID"),
		InterfaceVersion: getenv("GARM_INTERFACE_VERSION"), ExtraSpecs: getenv("GARM_POOL_EXTRASPECS")}
}

// Run executes one garm command and returns the exit status. stdout gets
// only the JSON result; everything else goes to stderr.
func Run(ctx context.Context, env Env, stdin io.Reader, stdout, stderr io.Writer) int {
	out, err := run(ctx, env, stdin, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "runway garm %s: %v\n", env.Command, err)
		if errors.Is(err, errNotFound) {
			return ExitCodeNotFound
		}
		return 1
	}
	if out != "" {
		fmt.Fprintln(stdout, out)
	}
	return 0
}

type provider struct {
	env   Env
	cfg   *config.Config
	garm  *Config
	sess  *cpi.Session
	log   logging.Logger
	reqID string
	n     int
}

func run(ctx context.Context, env Env, stdin io.Reader, stderr io.Writer) (string, error) {
	switch env.InterfaceVersion {
	case "", Version010, Version011:
	default:
		return "", fmt.Errorf("unsupported GARM_INTERFACE_VERSION %q (supported: %s, %s)", env.InterfaceVersion, Version010, Version011)
	}
	// Commands that need no config.
	switch env.Command {
	case "GetVersion":
		return Version, nil
	case "GetSupportedInterfaceVersions":
		b, _ := json.Marshal([]string{Version010, Version011})
		return string(b), nil
	case "GetConfigJSONSchema":
		return compact(ConfigSchema), nil
	case "GetExtraSpecsJSONSchema":
		return compact(ExtraSpecsSchema), nil
	case "":
		return "", errors.New("GARM_COMMAND is empty")
	}
	if env.ConfigFile == "" {
		return "", errors.New("GARM_PROVIDER_CONFIG_FILE is not set")
	}
	if env.ControllerID == "" {
		return "", errors.New("GARM_CONTROLLER_ID is not set")
	}
	cfg, err := config.Load(env.ConfigFile)
	if err != nil {
		return "", err
	}
	gc, err := parseConfig(cfg.Garm)
	if err != nil {
		return "", err
	}
	level, _ := logging.ParseLevel(cfg.LogLevel)
	reqID := "garm-" + strings.ToLower(env.Command)
	lc := logging.NewCall(level, stderr, reqID)
	sess, werr := cpi.NewSession(cfg, map[string]any{}, lc)
	if werr != nil {
		return "", werr
	}
	defer sess.Close()
	p := &provider{env: env, cfg: cfg, garm: gc, sess: sess, log: lc, reqID: reqID}

	switch env.Command {
	case "CreateInstance":
		var bi params.BootstrapInstance
		data, err := io.ReadAll(io.LimitReader(stdin, rpc.MaxRequestBytes))
		if err != nil {
			return "", fmt.Errorf("reading bootstrap params: %w", err)
		}
		if err := json.Unmarshal(data, &bi); err != nil {
			return "", fmt.Errorf("bootstrap params on stdin are not valid JSON: %w", err)
		}
		return p.create(ctx, bi)
	case "DeleteInstance":
		return "", p.delete(ctx, env.InstanceID)
	case "GetInstance":
		inst, err := p.get(ctx, env.InstanceID)
		if err != nil {
			return "", err
		}
		return marshal(inst)
	case "ListInstances":
		return p.list(ctx)
	case "RemoveAllInstances":
		return "", p.removeAll(ctx)
	case "StartInstance", "Start":
		return "", p.power(ctx, env.InstanceID, "start_vm")
	case "StopInstance", "Stop":
		return "", p.power(ctx, env.InstanceID, "stop_vm")
	case "ValidatePoolInfo":
		return "", p.validatePool(stdin)
	}
	return "", fmt.Errorf("unknown GARM_COMMAND %q", env.Command)
}

// call runs one CPI method through the shared service, hooks included,
// in this process: the result is the handler's own value.
func (p *provider) call(ctx context.Context, method string, args ...any) (any, *rpc.Error) {
	p.n++
	req, err := rpc.NewRequest(method, 2, map[string]any{"director_uuid": "garm-" + p.env.ControllerID,
		"request_id": fmt.Sprintf("%s-%d", p.reqID, p.n)}, args...)
	if err != nil {
		return nil, cpi.CpiError("%v", err)
	}
	return p.sess.Service.Invoke(ctx, req, p.sess.Hooks)
}

// listVMs answers list_vms for tags.
func (p *provider) listVMs(ctx context.Context, tags map[string]string) ([]cpi.ListedVM, *rpc.Error) {
	res, werr := p.call(ctx, "list_vms", tags)
	vms, _ := res.([]cpi.ListedVM)
	return vms, werr
}

// find lists this controller's VMs whose cid or instance name is id.
func (p *provider) find(ctx context.Context, id string) ([]cpi.ListedVM, error) {
	vms, werr := p.listVMs(ctx, map[string]string{TagController: p.env.ControllerID})
	if werr != nil {
		return nil, werr
	}
	var out []cpi.ListedVM
	for _, vm := range vms {
		if id != "" && (vm.CID == id || vm.Tags[TagName] == id) {
			out = append(out, vm)
		}
	}
	return out, nil
}

func instance(vm cpi.ListedVM) params.ProviderInstance {
	status := params.InstanceStatusUnknown
	switch vm.State {
	case "running":
		status = params.InstanceRunning
	case "stopped":
		status = params.InstanceStopped
	case "error":
		status = params.InstanceError
	}
	inst := params.ProviderInstance{ProviderID: vm.CID, Name: vm.Tags[TagName], OSType: params.OSType(vm.Tags[TagOSType]),
		OSArch: params.OSArch(vm.Tags[TagOSArch]), Status: status, Addresses: []params.Address{}}
	if inst.Name == "" {
		inst.Name = vm.CID
	}
	for _, n := range vm.Networks {
		if n.IP != "" {
			inst.Addresses = append(inst.Addresses, params.Address{Address: n.IP, Type: params.PrivateAddress})
		}
	}
	if status == params.InstanceError {
		inst.ProviderFault = []byte("the instance's runner process exited with an error; see its console log")
	}
	return inst
}

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
		p.log.Info("garm", "instance %s exists as %s: returning it", bi.Name, existing[0].CID)
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
			p.log.Error("garm", "cleaning up after a failed create of %s: %v", bi.Name, derr)
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

// userData renders garm's runner install: on the local driver the install
// script itself runs as the VM's process; elsewhere cloud-init (Linux) or
// the PowerShell user data (Windows) the images expect.
func (p *provider) userData(bi params.BootstrapInstance) (string, error) {
	tools, err := getTools(bi.OSType, bi.OSArch, bi.Tools)
	if err != nil {
		return "", err
	}
	if p.cfg.Driver == "local" && bi.OSType != params.Windows {
		script, err := cloudconfig.GetRunnerInstallScript(bi, tools, bi.Name)
		return string(script), err
	}
	return cloudconfig.GetCloudConfig(bi, tools, bi.Name)
}

func (p *provider) get(ctx context.Context, id string) (params.ProviderInstance, error) {
	vms, err := p.find(ctx, id)
	if err != nil {
		return params.ProviderInstance{}, err
	}
	if len(vms) == 0 {
		return params.ProviderInstance{}, fmt.Errorf("%w: %q (controller %s)", errNotFound, id, p.env.ControllerID)
	}
	return instance(vms[0]), nil
}

// delete removes every VM of this controller whose cid or name is id; none
// is not an error (garm retries deletes).
func (p *provider) delete(ctx context.Context, id string) error {
	if id == "" {
		return errors.New("GARM_INSTANCE_ID is not set")
	}
	vms, err := p.find(ctx, id)
	if err != nil {
		return err
	}
	return p.deleteAll(ctx, vms)
}

func (p *provider) deleteAll(ctx context.Context, vms []cpi.ListedVM) error {
	var errs []error
	for _, vm := range vms {
		if _, werr := p.call(ctx, "delete_vm", vm.CID); werr != nil && werr.Type != rpc.TypeVMNotFound {
			errs = append(errs, fmt.Errorf("%s: %w", vm.CID, werr))
			continue
		}
		if name := vm.Tags[TagName]; name != "" {
			_ = p.sess.Locker.Forget(ctx, "garm-"+nameKey(p.env.ControllerID, name))
		}
	}
	return errors.Join(errs...)
}

func (p *provider) list(ctx context.Context) (string, error) {
	if p.env.PoolID == "" {
		return "", errors.New("GARM_POOL_ID is not set")
	}
	vms, werr := p.listVMs(ctx, map[string]string{TagController: p.env.ControllerID, TagPool: p.env.PoolID})
	if werr != nil {
		return "", werr
	}
	out := []params.ProviderInstance{}
	for _, vm := range vms {
		out = append(out, instance(vm))
	}
	return marshal(out)
}

func (p *provider) removeAll(ctx context.Context) error {
	vms, werr := p.listVMs(ctx, map[string]string{TagController: p.env.ControllerID})
	if werr != nil {
		return werr
	}
	p.log.Info("garm", "removing %d instances of controller %s", len(vms), p.env.ControllerID)
	return p.deleteAll(ctx, vms)
}

func (p *provider) power(ctx context.Context, id, method string) error {
	vms, err := p.find(ctx, id)
	if err != nil {
		return err
	}
	if len(vms) == 0 {
		return fmt.Errorf("%w: %q (controller %s)", errNotFound, id, p.env.ControllerID)
	}
	if _, werr := p.call(ctx, method, vms[0].CID); werr != nil {
		return werr
	}
	return nil
}

// validatePool checks the extra specs and, when stdin names them, that
// the image and flavor are mapped.
func (p *provider) validatePool(stdin io.Reader) error {
	if p.env.ExtraSpecs != "" {
		raw, err := base64.StdEncoding.DecodeString(p.env.ExtraSpecs)
		if err != nil {
			return fmt.Errorf("GARM_POOL_EXTRASPECS is not base64: %w", err)
		}
		if _, err := parseExtraSpecs(raw); err != nil {
			return err
		}
	}
	data, _ := io.ReadAll(io.LimitReader(stdin, rpc.MaxRequestBytes))
	var pool struct {
		Image  string `json:"image"`
		Flavor string `json:"flavor"`
	}
	if len(bytes.TrimSpace(data)) > 0 {
		if err := json.Unmarshal(data, &pool); err != nil {
			return fmt.Errorf("pool info on stdin is not valid JSON: %w", err)
		}
	}
	_, _, err := p.resolve(context.Background(), pool.Image, pool.Flavor, &ExtraSpecs{Stemcell: "validated"})
	return err
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

func marshal(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

func compact(s string) string {
	var buf bytes.Buffer
	_ = json.Compact(&buf, []byte(s))
	return buf.String()
}
