package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/clip"
	"github.com/runway-cpi/runway/src/cpiclient"
)

// demoCmd walks a VM + disk + snapshot lifecycle through bin/cpi on the
// local driver, printing each call and its answer.
func demoCmd(args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	cpiPath := fs.String("cpi", defaultCPI(), "path to bin/cpi")
	keep := fs.Bool("keep", false, "keep the demo state dir")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dir, err := os.MkdirTemp("", "runway-demo-")
	if err != nil {
		return err
	}
	if !*keep {
		defer os.RemoveAll(dir)
	}
	state := filepath.Join(dir, "state")
	cfgPath := filepath.Join(dir, "cpi.json")
	cfg := fmt.Sprintf(`{"driver": "local", "state_dir": %q, "agent": {"ntp": ["pool.ntp.org"]}}`, state)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		return err
	}
	image, err := demoImage(dir)
	if err != nil {
		return err
	}
	c := &cpiclient.Client{Path: *cpiPath, ConfigPath: cfgPath, DirectorUUID: "runway-demo", APIVersion: 2,
		StemcellAPIVersion: 2, Timeout: time.Minute}
	fmt.Printf("Runway demo: a full lifecycle through %s on the local driver\nconfig: %s\n\n", *cpiPath, cfg)

	n := 0
	step := func(method string, args ...any) json.RawMessage {
		n++
		resp, err := c.Call(context.Background(), method, fmt.Sprintf("demo-%d", n), args...)
		if err != nil {
			fmt.Printf("%2d. %-16s FAILED: %v\n", n, method, err)
			if resp != nil {
				fmt.Print(resp.Log)
			}
			os.Exit(1)
		}
		fmt.Printf("%2d. %-16s %6.1f ms  %s\n", n, method, float64(resp.Duration.Microseconds())/1000, short(resp.Result))
		return resp.Result
	}
	str := func(raw json.RawMessage) string { var s string; _ = json.Unmarshal(raw, &s); return s }

	step("info")
	sc := str(step("create_stemcell", image, map[string]any{}))
	script := "#!/bin/sh\necho \"agent $RUNWAY_AGENT_ID booted in $RUNWAY_VM_DIR\"\nwhile sleep 1; do :; done\n"
	var vmRes []json.RawMessage
	_ = json.Unmarshal(step("create_vm", "demo-agent", sc, map[string]any{"user_data": script},
		map[string]any{"default": map[string]any{"type": "dynamic", "default": []string{"dns", "gateway"}}}, []string{}, map[string]any{}), &vmRes)
	vm := str(vmRes[0])
	step("has_vm", vm)
	step("set_vm_metadata", vm, map[string]string{"deployment": "demo", "name": "web/0", "index": "0"})
	disk := str(step("create_disk", 1024, map[string]any{}, vm))
	step("attach_disk", vm, disk)
	step("get_disks", vm)
	snap := str(step("snapshot_disk", disk, map[string]string{"deployment": "demo"}))
	step("delete_snapshot", snap)
	step("detach_disk", vm, disk)
	step("resize_disk", disk, 2048)
	step("delete_disk", disk)
	step("reboot_vm", vm)
	if b, err := os.ReadFile(filepath.Join(state, "vms", vm, "console.log")); err == nil {
		fmt.Printf("    console of %s:\n      %s\n", vm, strings.ReplaceAll(strings.TrimSpace(string(b)), "\n", "\n      "))
	}
	step("delete_vm", vm)
	step("has_vm", vm)
	step("delete_stemcell", sc)

	left := 0
	for _, kind := range []string{"vms", "disks", "snapshots", "stemcells"} {
		entries, _ := os.ReadDir(filepath.Join(state, kind))
		left += len(entries)
	}
	fmt.Printf("\n%d calls answered; %d resources left in %s.\n", n, left, state)
	if left != 0 {
		return fmt.Errorf("%d resources left behind", left)
	}
	return nil
}

func short(raw json.RawMessage) string {
	return clip.Quote(string(raw), 100)
}

// demoImage writes a tiny stemcell image tarball.
func demoImage(dir string) (string, error) {
	p := filepath.Join(dir, "image")
	f, err := os.Create(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	gz := gzip.NewWriter(f)
	tw := tar.NewWriter(gz)
	body := []byte("demo root image\n")
	if err := tw.WriteHeader(&tar.Header{Name: "root.img", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
		return "", err
	}
	if _, err := tw.Write(body); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", err
	}
	return p, gz.Close()
}
