// Command cpibench measures bin/cpi as the Director sees it: whole-process
// wall time per call. It prints medians and p90s; see docs/benchmarks.md.
package main

import (
	"archive/tar"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/runway-cpi/runway/src/cpiclient"
)

func main() {
	cpiPath := flag.String("cpi", "bin/cpi", "bin/cpi to measure")
	n := flag.Int("n", 200, "calls per measurement")
	procs := flag.Int("procs", 32, "concurrent processes for the throughput run")
	suite := flag.String("suite", "local", "local (driver timings), container (the local driver's container mode; root), startup (info beside an empty program), hooks (hook overhead), aws (calls against -endpoint) or openstack (calls against the cloud in OS_AUTH_URL)")
	endpoint := flag.String("endpoint", "", "IaaS API endpoint for -suite aws")
	drivers := flag.String("drivers", "local,openstack,aws", "configs -suite startup measures info with")
	rootfs := flag.String("rootfs", "", "rootfs tarball for -suite container (scripts/rootfs-dev path)")
	ephemeral := flag.Int("ephemeral", 64, "-suite container: each VM's writable layer, MiB (0: leave the key out, for an older bin/cpi)")
	live := flag.Int("live", 1, "-suite container: idle VMs running while create_vm and delete_vm are timed")
	lb := flag.Bool("lb", false, "every VM with a floating IP (vip network) and an Octavia pool member (-suite openstack), or in a target group with an encrypted ephemeral disk (-suite aws)")
	flag.Parse()
	runSuite := run
	switch *suite {
	case "container":
		runSuite = func(cpi string, n, procs int) error {
			return runContainer(cpi, *rootfs, n, procs, containerOpts{ephemeralMiB: *ephemeral, live: *live})
		}
	case "hooks":
		runSuite = func(cpi string, n, _ int) error { return runHooks(cpi, n) }
	case "startup":
		runSuite = func(cpi string, n, _ int) error { return runStartup(cpi, n, strings.Split(*drivers, ",")) }
	case "aws", "openstack":
		runSuite = func(cpi string, n, _ int) error {
			s, err := awsSuite(*endpoint)
			if *suite == "openstack" {
				s, err = openstackSuite()
			}
			if err != nil {
				return err
			}
			if *lb {
				with := withFloatingIPAndPool
				if s.driver == "aws" {
					with = withTargetGroup
				}
				cleanup, err := with(&s)
				if err != nil {
					return err
				}
				defer cleanup()
			}
			return runCloud(cpi, s, n)
		}
	}
	if err := runSuite(*cpiPath, *n, *procs); err != nil {
		fmt.Fprintln(os.Stderr, "cpibench:", err)
		os.Exit(1)
	}
}

func run(cpiPath string, n, procs int) error {
	dir, err := os.MkdirTemp("", "cpibench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := filepath.Join(dir, "cpi.json")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(`{"driver":"local","state_dir":%q}`, filepath.Join(dir, "state"))), 0o600); err != nil {
		return err
	}
	callOK := caller(cpiPath, cfg)

	fmt.Printf("bin/cpi: %s, %d calls per measurement, %d CPUs\n\n", cpiPath, n, runtime.NumCPU())
	var info []time.Duration
	for i := 0; i < n; i++ {
		_, d, err := callOK("info")
		if err != nil {
			return err
		}
		info = append(info, d)
	}
	report("info (whole process)", info)

	img := filepath.Join(dir, "image")
	f, _ := os.Create(img)
	tw := tar.NewWriter(f)
	tw.WriteHeader(&tar.Header{Name: "root.img", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg})
	tw.Write([]byte("x"))
	tw.Close()
	f.Close()
	res, _, err := callOK("create_stemcell", img, map[string]any{})
	if err != nil {
		return err
	}
	var sc string
	json.Unmarshal(res, &sc)

	nets := map[string]any{"default": map[string]any{"type": "dynamic"}}
	for _, variant := range []struct {
		name  string
		props map[string]any
	}{{"no process", map[string]any{}}, {"with a process", map[string]any{"command": "exec sleep 600"}}} {
		var creates, deletes []time.Duration
		for i := 0; i < n/4; i++ {
			res, d, err := callOK("create_vm", "bench", sc, variant.props, nets, []string{}, map[string]any{})
			if err != nil {
				return err
			}
			creates = append(creates, d)
			var pair []json.RawMessage
			json.Unmarshal(res, &pair)
			var vm string
			json.Unmarshal(pair[0], &vm)
			_, d, err = callOK("delete_vm", vm)
			if err != nil {
				return err
			}
			deletes = append(deletes, d)
		}
		report("local create_vm ("+variant.name+")", creates)
		report("local delete_vm ("+variant.name+")", deletes)
	}

	// Throughput: procs workers, each creating a disk and a VM and
	// attaching the disk, then deleting both.
	total := procs * 4
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, procs)
	for w := 0; w < procs; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < total/procs; i++ {
				res, _, err := callOK("create_vm", "bench", sc, map[string]any{}, nets, []string{}, map[string]any{})
				if err != nil {
					errs <- err
					return
				}
				var pair []json.RawMessage
				json.Unmarshal(res, &pair)
				var vm string
				json.Unmarshal(pair[0], &vm)
				if _, _, err := callOK("delete_vm", vm); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	el := time.Since(start)
	fmt.Printf("%-40s %d processes, %d calls in %s: %.0f calls/s\n", "concurrent create_vm+delete_vm", procs, total*2, el.Round(time.Millisecond), float64(total*2)/el.Seconds())
	_, _, err = callOK("delete_stemcell", sc)
	return err
}

// caller answers a call's result and duration through bin/cpi at path
// with config cfg, the Director's way (API v2, stemcell API v2).
func caller(path, cfg string) func(method string, args ...any) (json.RawMessage, time.Duration, error) {
	c := &cpiclient.Client{Path: path, ConfigPath: cfg, DirectorUUID: "bench", APIVersion: 2, StemcellAPIVersion: 2, Timeout: time.Minute}
	return func(method string, args ...any) (json.RawMessage, time.Duration, error) {
		r, err := c.Call(context.Background(), method, "", args...)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", method, err)
		}
		return r.Result, r.Duration, nil
	}
}

func report(name string, ds []time.Duration) {
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	q := func(p float64) float64 { return float64(ds[int(p*float64(len(ds)-1))].Microseconds()) / 1000 }
	fmt.Printf("%-40s median %6.2f ms  p90 %6.2f ms  (n=%d)\n", name, q(0.5), q(0.9), len(ds))
}
