// Command cpi is Runway's bin/cpi, the one entry point callers run. It
// answers `info` itself — bosh-cli asks it before every call, so its cost
// is paid twice per method — and runs everything else in the executable
// of the config's driver (cpi-local, cpi-openstack or cpi-aws, beside it),
// handing over the request unchanged. It loads no driver, so `info` costs
// little more than starting an empty program (docs/benchmarks.md).
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/driver/formats"
)

// maxRequestBytes matches rpc.MaxRequestBytes (a test keeps them equal):
// a bigger request is the full executable's to refuse.
const maxRequestBytes = 4 << 20

// apiVersion matches cpi.APIVersion (a test keeps them equal).
const apiVersion = 3

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
	configPath := configPathArg(args)
	if os.Getenv("GARM_COMMAND") != "" {
		// garm names its config in the environment; stdin is garm's.
		return handOver(exec, driverOf(os.Getenv("GARM_PROVIDER_CONFIG_FILE")), args, nil, stdout, stderr)
	}
	request, err := io.ReadAll(io.LimitReader(stdin, maxRequestBytes+1))
	if err != nil {
		request = nil
	}
	cfg := readConfig(configPath)
	if answer := fastInfo(request, cfg); answer != nil {
		if _, err := stdout.Write(answer); err != nil {
			fmt.Fprintf(stderr, "cpi: writing response: %v\n", err)
			return 1
		}
		return 0
	}
	return handOver(exec, cfg.driver(), args, request, stdout, stderr)
}

// handOver execs the driver's executable; it returns only when that
// fails, after answering the caller with a CpiError.
func handOver(exec execer, driver string, args []string, request []byte, stdout, stderr io.Writer) int {
	err := exec(driver, args, request)
	msg := fmt.Sprintf("cannot run cpi-%s, the executable of driver %s beside bin/cpi (install the whole package): %v", driver, driver, err)
	fmt.Fprintln(stderr, "cpi:", msg)
	enc := json.NewEncoder(stdout)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(map[string]any{"result": nil, "log": msg + "\n",
		"error": map[string]any{"type": "Bosh::Clouds::CpiError", "message": msg, "ok_to_retry": false}}); err != nil {
		return 1
	}
	return 0
}

// config is what bin/cpi reads of the config file: which driver, whether
// hooks wrap calls (then info goes through them, in the driver's
// executable), and the local driver's formats. Everything else is the
// driver executable's to read and check; an unreadable file is reported
// by it too.
type config struct {
	ok     bool
	Driver string          `json:"driver"`
	Hooks  json.RawMessage `json:"hooks"`
	Local  struct {
		StemcellFormats []string `json:"stemcell_formats"`
	} `json:"local"`
	// The official CPIs' shape: {"cloud": {"plugin": …, "properties": …}}.
	Cloud *struct {
		Plugin string `json:"plugin"`
	} `json:"cloud"`
}

func readConfig(path string) config {
	if path == "" {
		return config{ok: true, Driver: "local"} // the embedded default
	}
	b, err := os.ReadFile(path)
	var c config
	if err != nil || json.Unmarshal(b, &c) != nil {
		return config{}
	}
	c.ok = true
	return c
}

func (c config) driver() string {
	switch {
	case c.Driver != "":
		return c.Driver
	case c.Cloud != nil && c.Cloud.Plugin != "":
		return c.Cloud.Plugin
	}
	return "local" // its executable reports what is wrong with the config
}

func driverOf(path string) string {
	if path == "" {
		return "local"
	}
	return readConfig(path).driver()
}

// fastInfo answers a plain info call, as the driver's executable would,
// or nil when anything calls for the executable: another method, hooks, a
// context that could change the driver's section, a malformed request or
// config. It does not check the driver's own section: a mistake there is
// reported by the first other call, as the official CPIs do.
func fastInfo(request []byte, cfg config) []byte {
	if !cfg.ok || len(bytes.TrimSpace(cfg.Hooks)) > 0 && !bytes.Equal(bytes.TrimSpace(cfg.Hooks), []byte("null")) {
		return nil
	}
	var req struct {
		Method     string            `json:"method"`
		Arguments  []json.RawMessage `json:"arguments"`
		Context    map[string]any    `json:"context"`
		APIVersion *json.Number      `json:"api_version"`
	}
	dec := json.NewDecoder(bytes.NewReader(request))
	dec.UseNumber()
	if dec.Decode(&req) != nil || dec.More() || req.Method != "info" || req.Arguments == nil || len(req.Arguments) != 0 {
		return nil
	}
	if _, ok := req.Context["director_uuid"].(string); !ok {
		return nil
	}
	for k := range req.Context {
		if k != "director_uuid" && k != "request_id" && k != "vm" {
			return nil
		}
	}
	if req.APIVersion != nil {
		if n, err := req.APIVersion.Int64(); err != nil || n < 1 || strings.ContainsAny(string(*req.APIVersion), ".eE") {
			return nil
		}
	}
	driver := cfg.driver()
	f, known := formats.Of(driver)
	if !known || cfg.Cloud != nil {
		return nil
	}
	if driver == "local" && len(cfg.Local.StemcellFormats) > 0 {
		f = cfg.Local.StemcellFormats
	}
	type info struct {
		APIVersion      int      `json:"api_version"`
		StemcellFormats []string `json:"stemcell_formats"`
	}
	b, err := json.Marshal(struct {
		Result info    `json:"result"`
		Error  *string `json:"error"`
		Log    string  `json:"log"`
	}{Result: info{apiVersion, f}})
	if err != nil {
		return nil
	}
	return append(b, '\n')
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
	if !slices.Contains(formats.Drivers, driver) {
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
