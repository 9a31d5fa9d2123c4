package garm

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

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
	log   logging.Fields
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
	sess, werr := cpi.NewSession(cfg, nil, lc)
	if werr != nil {
		return "", werr
	}
	defer sess.Close()
	p := &provider{env: env, cfg: cfg, garm: gc, sess: sess, log: logging.Fields{Logger: lc, Tag: "garm"}, reqID: reqID}

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

func marshal(v any) (string, error) {
	b, err := json.Marshal(v)
	return string(b), err
}

func compact(s string) string {
	var buf bytes.Buffer
	_ = json.Compact(&buf, []byte(s))
	return buf.String()
}
