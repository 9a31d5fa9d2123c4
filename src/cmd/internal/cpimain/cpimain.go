// Package cpimain is the main of the full CPI executables (cpi-local,
// cpi-openstack, cpi-aws, cpi-kubernetes: each carries one driver): one JSON request on
// stdin, one JSON response on stdout, exit 0 whenever a response was
// written; garm's protocol when GARM_COMMAND is set. bin/cpi execs them.
package cpimain

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/cpi"
	"github.com/runway-cpi/runway/src/garm"
)

// Main runs one call and answers the exit status.
func Main() int { return run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr) }

func init() {
	// Descriptors a caller leaked to us must not reach VM processes or
	// hooks (a Director pipe held open by a VM would hang the Director).
	_ = unix.CloseRange(3, ^uint(0), unix.CLOSE_RANGE_CLOEXEC)
}

func run(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// garm runs providers with GARM_COMMAND set and a cleared environment.
	if os.Getenv("GARM_COMMAND") != "" {
		ctx, stop := signalContext()
		defer stop()
		return garm.Run(ctx, garm.EnvFrom(os.Getenv), stdin, stdout, stderr)
	}
	fs := flag.NewFlagSet("cpi", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("configPath", "", "path to the CPI config (JSON); without it the local driver runs with a default state dir")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	opts := cpi.Options{Stderr: stderr}
	if *configPath != "" {
		opts.Config, opts.ConfigErr = config.Load(*configPath)
	} else {
		opts.Config, opts.ConfigErr = config.Embedded()
	}
	ctx, stop := signalContext()
	defer stop()
	if err := cpi.Serve(ctx, stdin, stdout, opts); err != nil {
		fmt.Fprintf(stderr, "cpi: writing response: %v\n", err)
		return 1
	}
	return 0
}

// signalContext ends with SIGTERM or SIGINT, naming the signal as its
// cause (the response says why the call stopped).
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		if sig, ok := <-sigs; ok {
			cancel(fmt.Errorf("%s received: the caller ended the call", unix.SignalName(sig.(syscall.Signal))))
		}
	}()
	return ctx, func() { signal.Stop(sigs); cancel(nil) }
}
