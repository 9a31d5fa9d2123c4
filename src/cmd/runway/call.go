package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/runway-cpi/runway/src/cpiclient"
	"github.com/runway-cpi/runway/src/rpc"
)

// defaultCPI is bin/cpi next to this executable.
func defaultCPI() string {
	if exe, err := os.Executable(); err == nil {
		return filepath.Join(filepath.Dir(exe), "cpi")
	}
	return "bin/cpi"
}

func callCmd(args []string) error {
	fs := flag.NewFlagSet("call", flag.ContinueOnError)
	cpiPath := fs.String("cpi", defaultCPI(), "path to the CPI executable")
	cfg := fs.String("config", "", "CPI config file (-configPath)")
	api := fs.Int("api-version", 2, "api_version to send (0: omit)")
	stemcellAPI := fs.Int("stemcell-api-version", 2, "context.vm.stemcell.api_version (0: omit)")
	timeout := fs.Duration("timeout", 10*time.Minute, "kill the CPI after this long")
	showLog := fs.Bool("log", false, "print the response log to stderr")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() < 1 {
		return errors.New("call: method required, e.g. runway call has_vm '\"vm-123\"'")
	}
	var margs []any
	for i, a := range fs.Args()[1:] {
		var v any
		if err := json.Unmarshal([]byte(a), &v); err != nil {
			return fmt.Errorf("argument %d is not JSON (quote strings: '\"vm-1\"'): %v", i+1, err)
		}
		margs = append(margs, v)
	}
	c := &cpiclient.Client{Path: *cpiPath, ConfigPath: *cfg, DirectorUUID: "runway-cli", APIVersion: *api,
		StemcellAPIVersion: *stemcellAPI, Timeout: *timeout, Env: os.Environ()}
	resp, err := c.Call(context.Background(), fs.Arg(0), fmt.Sprintf("cli-%d", os.Getpid()), margs...)
	if resp != nil && *showLog {
		fmt.Fprint(os.Stderr, resp.Log)
	}
	var cpiErr *rpc.Error
	if errors.As(err, &cpiErr) {
		b, _ := json.MarshalIndent(cpiErr, "", "  ")
		fmt.Println(string(b))
		os.Exit(1)
	}
	if err != nil {
		return err
	}
	fmt.Println(string(resp.Result))
	return nil
}
