package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// containerOpts: the VMs' writable layer size (MiB; 0: the key is left
// out, for a bin/cpi from before it) and how many idle VMs live on beside
// the measured ones.
type containerOpts struct {
	ephemeralMiB, live int
}

// runContainer times the local driver's container mode: create_vm and
// delete_vm one after another (with o.live other VMs running), then procs
// VMs created at once, running together, and deleted at once. bin/cpi runs
// in a network namespace made here (through nsenter, ~1 ms of each call),
// as in the tests.
func runContainer(cpiPath, rootfs string, n, procs int, o containerOpts) error {
	if rootfs == "" {
		return fmt.Errorf("-rootfs: a rootfs tarball is needed (scripts/rootfs-dev path)")
	}
	callOK, cleanup, err := containerCaller(cpiPath, o.ephemeralMiB)
	if err != nil {
		return err
	}
	defer cleanup()
	fmt.Printf("bin/cpi: %s, container mode (%s), rootfs %s\n\n", cpiPath, runtimeName(), rootfs)
	res, d, err := callOK("create_stemcell", rootfs, map[string]any{})
	if err != nil {
		return err
	}
	fmt.Printf("%-40s %s\n", "create_stemcell (unpack the rootfs)", d.Round(time.Millisecond))
	var sc string
	json.Unmarshal(res, &sc)
	defer callOK("delete_stemcell", sc)

	// A PID 1 that ends on SIGTERM, as a real init does.
	props := map[string]any{"ram": 256, "cpu": 1, "command": "trap 'exit 0' TERM; while :; do sleep 600 & wait $!; done"}
	nets := map[string]any{"default": map[string]any{"type": "dynamic"}}
	create := func() (string, time.Duration, error) {
		res, d, err := callOK("create_vm", "bench", sc, props, nets, []string{}, map[string]any{})
		if err != nil {
			return "", 0, err
		}
		var pair []json.RawMessage
		json.Unmarshal(res, &pair)
		var vm string
		json.Unmarshal(pair[0], &vm)
		return vm, d, nil
	}
	var live []string
	defer func() {
		for _, vm := range live {
			_, _, _ = callOK("delete_vm", vm)
		}
	}()
	start := time.Now()
	for range o.live {
		vm, _, err := create()
		if err != nil {
			return err
		}
		live = append(live, vm)
	}
	if o.live > 0 {
		fmt.Printf("%-40s %s\n", fmt.Sprintf("%d live VMs made", o.live), time.Since(start).Round(time.Millisecond))
	}
	var creates, deletes []time.Duration
	for i := 0; i < n; i++ {
		vm, d, err := create()
		if err != nil {
			return err
		}
		creates = append(creates, d)
		if _, d, err = callOK("delete_vm", vm); err != nil {
			return err
		}
		deletes = append(deletes, d)
	}
	report(fmt.Sprintf("container create_vm (%d live)", o.live), creates)
	report(fmt.Sprintf("container delete_vm (%d live)", o.live), deletes)
	return concurrentVMs(procs, create, callOK)
}

// cpiCall calls bin/cpi once: the answer's result and how long it took.
type cpiCall = func(method string, args ...any) (json.RawMessage, time.Duration, error)

// containerCaller calls bin/cpi as the Director would, inside a network
// namespace of its own, on a container-mode config in a scratch
// directory; cleanup removes both.
func containerCaller(cpiPath string, ephemeralMiB int) (cpiCall, func(), error) {
	dir, err := os.MkdirTemp("", "cpibench-ctr-")
	if err != nil {
		return nil, nil, err
	}
	ns := "rwbench" + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", ns).CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return nil, nil, fmt.Errorf("ip netns add: %v: %s", err, out)
	}
	cleanup := func() {
		exec.Command("ip", "netns", "del", ns).Run()
		os.RemoveAll(dir)
	}
	wrapper := filepath.Join(dir, "cpi-in-ns")
	cfg := filepath.Join(dir, "cpi.json")
	ctr := map[string]any{"bridge": "rwb0", "cidr": "10.252.0.0/22"}
	if ephemeralMiB > 0 {
		ctr["default_ephemeral_disk_mib"] = ephemeralMiB
	}
	b, _ := json.Marshal(map[string]any{"driver": "local", "state_dir": filepath.Join(dir, "state"),
		"local": map[string]any{"isolation": "container", "stop_grace_seconds": 5, "container": ctr}})
	if err := errors.Join(
		os.WriteFile(wrapper, []byte(fmt.Sprintf("#!/bin/sh\nexec nsenter --net=/run/netns/%s -- %s \"$@\"\n", ns, cpiPath)), 0o755),
		os.WriteFile(cfg, b, 0o600)); err != nil {
		cleanup()
		return nil, nil, err
	}
	return caller(wrapper, cfg), cleanup, nil
}

// concurrentVMs creates procs VMs at once, reports how long that took and
// the memory their cgroups use together, and deletes them at once.
func concurrentVMs(procs int, create func() (string, time.Duration, error), callOK cpiCall) error {
	vms := make([]string, procs)
	errs := make(chan error, procs)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range vms {
		wg.Add(1)
		go func() {
			defer wg.Done()
			vm, _, err := create()
			if err != nil {
				errs <- err
			}
			vms[i] = vm
		}()
	}
	wg.Wait()
	created := time.Since(start)
	var used int64
	for _, vm := range vms {
		if vm == "" {
			continue
		}
		for _, g := range []string{"/sys/fs/cgroup/memory/runway", "/sys/fs/cgroup/unified/runway"} {
			m, _ := filepath.Glob(filepath.Join(g, "*-"+vm, "memory.usage_in_bytes"))
			for _, p := range m {
				b, _ := os.ReadFile(p)
				v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
				used += v
			}
		}
	}
	start = time.Now()
	for _, vm := range vms {
		if vm == "" {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, _, err := callOK("delete_vm", vm); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	deleted := time.Since(start)
	close(errs)
	for err := range errs {
		return err
	}
	fmt.Printf("%-40s %d VMs created in %s, deleted in %s; running together they used %.1f MiB (their cgroups)\n",
		"concurrent VMs", procs, created.Round(time.Millisecond), deleted.Round(time.Millisecond), float64(used)/(1<<20))
	return nil
}

func runtimeName() string {
	for _, n := range []string{"runc", "crun"} {
		if p, err := exec.LookPath(n); err == nil {
			out, _ := exec.Command(p, "--version").Output()
			return strings.SplitN(string(out), "\n", 2)[0]
		}
	}
	return "no runtime"
}
