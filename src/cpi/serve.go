package cpi

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"
	"time"

	boshlog "github.com/cloudfoundry/bosh-utils/logger"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/hooks"
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/retry"
	"github.com/runway-cpi/runway/src/rpc"
)

// Options configure Serve.
type Options struct {
	Config    *config.Config
	ConfigErr error // a config that failed to load is reported as CpiError
	Stderr    io.Writer
}

// Serve answers exactly one request from in on out. It returns an error only
// when the response itself could not be written; callers exit 0 otherwise.
func Serve(ctx context.Context, in io.Reader, out io.Writer, opts Options) error {
	stderr := opts.Stderr
	if stderr == nil {
		stderr = os.Stderr
	}
	level := boshlog.LevelInfo
	if opts.Config != nil {
		if l, err := logging.ParseLevel(opts.Config.LogLevel); err == nil {
			level = l
		}
	} else if l, err := logging.ParseLevel(""); err == nil {
		level = l
	}

	req, werr := rpc.ReadRequest(in)
	reqID := ""
	if req != nil {
		reqID = req.RequestID()
	}
	lc := logging.NewCall(level, stderr, reqID)
	resp := rpc.Response{}
	if werr == nil {
		resp.Result, werr = handleBounded(ctx, req, opts, lc)
	}
	if werr != nil {
		// The answer's message is redacted as the log is: a credential the
		// call was given, or one inside a URL, never comes back in it.
		werr.Message = lc.Redactor().Redact(werr.Message)
		logging.Fields{Logger: lc, Tag: "cpi"}.Error("call failed", "error", werr.Error())
		resp.Error = werr
	}
	resp.Log = lc.Trace()
	return rpc.WriteResponse(out, resp)
}

// InterruptGrace is how long a call may take to wind down after its
// context ends (SIGTERM: the Director's and cpiclient's way to end a call
// past its timeout) before the response is written without it.
const InterruptGrace = 500 * time.Millisecond

// handleBounded runs the call and, once ctx ends, answers within
// InterruptGrace whatever the call is blocked on: a typed error naming
// why. What the call made part-way is left for later calls to sweep.
func handleBounded(ctx context.Context, req *rpc.Request, opts Options, lc *logging.Call) (any, *rpc.Error) {
	type answer struct {
		res  any
		werr *rpc.Error
	}
	done := make(chan answer, 1)
	go func() {
		res, werr := handle(ctx, req, opts, lc)
		done <- answer{res, werr}
	}()
	var a answer
	select {
	case a = <-done:
	case <-ctx.Done():
		select {
		case a = <-done:
		case <-time.After(InterruptGrace):
			return nil, CloudError("%s interrupted (%v) and ended without waiting for the step it was in", req.Method, context.Cause(ctx))
		}
	}
	if a.werr != nil && ctx.Err() != nil {
		return nil, CloudError("%s interrupted (%v): %s", req.Method, context.Cause(ctx), a.werr.Message)
	}
	return a.res, a.werr
}

func handle(ctx context.Context, req *rpc.Request, opts Options, lc *logging.Call) (res any, werr *rpc.Error) {
	defer func() {
		if p := recover(); p != nil {
			// The stack goes to stderr only; stdout gets a clean CpiError.
			fmt.Fprintf(os.Stderr, "panic in %s: %v\n%s", req.Method, p, debug.Stack())
			res, werr = nil, CpiError("%s: internal error: %v", req.Method, p)
		}
	}()
	start := time.Now()
	// Secrets the caller handed us must not come back in the trace.
	lc.Redactor().Add(logging.CollectSecrets(req.Context)...)
	var args []any
	for _, a := range req.Arguments {
		var v any
		_ = json.Unmarshal(a, &v)
		args = append(args, v)
	}
	lc.Redactor().Add(logging.CollectSecrets(args)...)
	log := logging.Fields{Logger: lc, Tag: "cpi"}
	log.Debug("request", "method", req.Method, "api_version", req.APIVersion, "stemcell_api_version", req.StemcellAPIVersion(),
		"arguments", mustJSON(logging.Redacted(args)))

	if !Known(req.Method) {
		return nil, NotImplemented("Must call implemented method: %s", req.Method)
	}
	if opts.ConfigErr != nil {
		return nil, CpiError("%v", opts.ConfigErr)
	}
	sess, werr := NewSession(opts.Config, req.CPIConfig(), lc)
	if werr != nil {
		return nil, werr
	}
	defer sess.Close()
	res, werr = sess.Service.Invoke(ctx, req, sess.Hooks)
	if werr == nil {
		log.Info("finished", "method", req.Method, "took", time.Since(start).Round(time.Microsecond))
	}
	return res, werr
}

// Session is what one call needs: the service over its driver, and the
// hooks runner (nil without hooks). Both front doors (BOSH and garm) use it.
type Session struct {
	Service *Service
	Hooks   *hooks.Runner
	Locker  *lock.Locker // the driver's locks, for front-door locks too
}

// Close releases the session's temporary files.
func (s *Session) Close() {
	if s.Hooks != nil {
		s.Hooks.Close()
	}
}

// NewSession builds the driver from cfg (with a request's cpi-config
// properties over the file's driver section) and the hooks runner.
func NewSession(cfg *config.Config, cpiConfig map[string]any, lc *logging.Call) (*Session, *rpc.Error) {
	reg, ok := driver.Lookup(cfg.Driver)
	if !ok {
		return nil, CpiError("driver %q is not built into this executable (it has: %s): run bin/cpi, which runs the executable of the driver the config names", cfg.Driver, strings.Join(driver.Names(), ", "))
	}
	locker, err := lock.New(cfg.StateDir+"/locks", cfg.LockTimeout(), lc)
	if err != nil {
		return nil, CloudError("state dir %s: %v", cfg.StateDir, err)
	}
	// A driver that cannot be built (its section, the request context) is
	// the method's error, after the pre hooks saw the call.
	var drv driver.Driver
	var drvErr *rpc.Error
	section, fromContext, err := config.MergeContext(reg.Section, cfg.DriverSection(), cpiConfig)
	if err != nil {
		drvErr = CpiError("%v", err)
	} else {
		var sectionVal any
		_ = json.Unmarshal(section, &sectionVal)
		lc.Redactor().Add(logging.CollectSecrets(sectionVal)...)
		policy := retry.Policy{
			Base:     time.Duration(cfg.Retry.InitialBackoffMilli) * time.Millisecond,
			MaxSleep: time.Duration(cfg.Retry.MaxBackoffSeconds) * time.Second,
			Budget:   time.Duration(cfg.Retry.WaitBudgetSeconds) * time.Second,
			Log:      logging.Fields{Logger: lc, Tag: "retry"}.Info,
		}
		deps := driver.Deps{StateDir: cfg.StateDir, Logger: lc, Locker: locker, Retry: policy, Redact: lc.Redactor().Add}
		if len(fromContext) > 0 {
			deps.Host = cfg.DriverSection()
		}
		drv, err = reg.New(section, deps)
		if err != nil {
			drvErr = CpiError("driver %s: %v", cfg.Driver, err)
			if len(fromContext) > 0 {
				drvErr = CpiError("driver %s: %v (the config file's %s section with the request context's %s over it)",
					cfg.Driver, err, cfg.Driver, strings.Join(fromContext, ", "))
			}
		}
	}
	sess := &Session{Service: &Service{Config: cfg, Driver: drv, DriverErr: drvErr, Logger: lc}, Locker: locker}
	if cfg.HasHooks() {
		hc, err := hooks.ParseConfig(cfg.Hooks, cfg.StateDir, Known)
		if err != nil {
			return nil, CpiError("config %s: %v", cfg.Path, err)
		}
		sess.Hooks = hooks.New(hc, lc)
	}
	return sess, nil
}

func mustJSON(v any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return fmt.Sprintf("%v", v)
	}
	return strings.TrimSuffix(b.String(), "\n")
}
