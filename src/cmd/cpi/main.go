// Command cpi is Runway's bin/cpi, the one entry point callers run. It
// answers `info` itself — bosh-cli asks it before every call, so its cost
// is paid twice per method — and runs everything else in the executable
// of the config's driver (cpi-local, cpi-openstack, cpi-aws or cpi-kubernetes, beside it),
// handing over the request unchanged. It loads no driver, so `info` costs
// little more than starting an empty program (docs/benchmarks.md); it
// reads the config and the request with the packages every executable
// uses (config, rpc), so an invalid config is refused here too.
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver/catalog"
	"github.com/runway-cpi/runway/src/rpc"
)

func main() {
	// Descriptors a caller leaked to us must not reach VM processes or
	// hooks (a Director pipe held open by a VM would hang the Director).
	_ = unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
	os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr, execDriver))
}

// execer replaces the process with the driver's executable, stdin holding
// request (nil: stdin untouched).
type execer func(driver string, args []string, request []byte) error

func run(args []string, stdin io.Reader, stdout, stderr io.Writer, exec execer) int {
	if os.Getenv("GARM_COMMAND") != "" {
		// garm names its config in the environment; stdin is garm's. The
		// driver's executable reports a config it cannot use.
		driver := "local"
		if path := os.Getenv("GARM_PROVIDER_CONFIG_FILE"); path != "" {
			if cfg, err := config.Load(path); err == nil {
				driver = cfg.Driver
			}
		}
		return handOver(exec, driver, args, nil, stdout, stderr)
	}
	request, err := io.ReadAll(io.LimitReader(stdin, rpc.MaxRequestBytes+1))
	if err != nil {
		request = nil
	}
	var cfg *config.Config
	if path := configPathArg(args); path != "" {
		cfg, err = config.Load(path)
	} else {
		cfg, err = config.Embedded()
	}
	if err != nil {
		return answer(stdout, stderr, rpc.Response{Error: rpc.NewError(rpc.TypeCpiError, false, "%v", err), Log: err.Error() + "\n"})
	}
	if info, ok := plainInfo(request, cfg); ok {
		return answer(stdout, stderr, rpc.Response{Result: info})
	}
	return handOver(exec, cfg.Driver, args, request, stdout, stderr)
}

func answer(stdout, stderr io.Writer, resp rpc.Response) int {
	if err := rpc.WriteResponse(stdout, resp); err != nil {
		fmt.Fprintf(stderr, "cpi: writing response: %v\n", err)
		return 1
	}
	return 0
}

// handOver execs the driver's executable; it returns only when that
// fails, after answering the caller with a CpiError.
func handOver(exec execer, driver string, args []string, request []byte, stdout, stderr io.Writer) int {
	err := exec(driver, args, request)
	msg := fmt.Sprintf("cannot run cpi-%s, the executable of driver %s beside bin/cpi (install the whole package): %v", driver, driver, err)
	fmt.Fprintln(stderr, "cpi:", msg)
	return answer(stdout, stderr, rpc.Response{Error: rpc.NewError(rpc.TypeCpiError, false, "%s", msg), Log: msg + "\n"})
}

// plainInfo answers a plain info call as the driver's executable would,
// or says the executable must: another method, hooks (they wrap info
// too), a context with cpi-config properties (they could change the
// driver's section), a malformed request. It does not check the driver's
// own section: a mistake there is reported by the first other call, as
// the official CPIs do.
func plainInfo(request []byte, cfg *config.Config) (rpc.Info, bool) {
	if cfg.HasHooks() {
		return rpc.Info{}, false
	}
	req, werr := rpc.ParseRequest(request)
	if werr != nil || req.Method != "info" || len(req.Arguments) != 0 || req.CPIConfig() != nil {
		return rpc.Info{}, false
	}
	f, ok := catalog.Answered(cfg.Driver, cfg.DriverSection())
	return rpc.Info{APIVersion: rpc.APIVersion, StemcellFormats: f}, ok
}

// configPathArg finds -configPath in args (flag syntax: -configPath X,
// -configPath=X, with one or two dashes); the driver's executable parses
// them again.
func configPathArg(args []string) string {
	for i, a := range args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !strings.HasPrefix(a, "-") || name != "configPath" {
			continue
		}
		if hasValue {
			return value
		}
		if i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// execDriver replaces this process with cpi-<driver> from bin/cpi's own
// directory. The request, already read, goes back on stdin through an
// in-memory file.
func execDriver(driver string, args []string, request []byte) error {
	if !slices.Contains(catalog.Names(), driver) {
		// An unknown driver name: cpi-local's config check names it.
		driver = "local"
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	path := filepath.Join(filepath.Dir(self), "cpi-"+driver)
	if request != nil {
		fd, err := unix.MemfdCreate("cpi-request", 0)
		if err != nil {
			return fmt.Errorf("holding the request: %w", err)
		}
		if _, err := unix.Write(fd, request); err != nil {
			return fmt.Errorf("holding the request: %w", err)
		}
		if _, err := unix.Seek(fd, 0, io.SeekStart); err != nil {
			return fmt.Errorf("holding the request: %w", err)
		}
		if err := unix.Dup2(fd, 0); err != nil {
			return fmt.Errorf("holding the request: %w", err)
		}
		_ = unix.Close(fd)
	}
	if err := syscall.Exec(path, append([]string{path}, args...), os.Environ()); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}
