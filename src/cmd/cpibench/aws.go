package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/runway-cpi/runway/src/cpiclient"
	"github.com/runway-cpi/runway/src/testkit/faultproxy"
)

// runAWS measures the Director's disk and VM calls against an EC2 API:
// whole-process wall time and HTTP requests per call, counted by a
// pass-through proxy in front of the endpoint.
func runAWS(cpiPath, endpoint string, n int) error {
	if endpoint == "" {
		return fmt.Errorf("-suite aws needs -endpoint")
	}
	p, err := faultproxy.New(endpoint, faultproxy.AWS)
	if err != nil {
		return err
	}
	url, stop := p.Start()
	defer stop()
	dir, err := os.MkdirTemp("", "cpibench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := map[string]any{"driver": "aws", "state_dir": filepath.Join(dir, "state"),
		"aws": map[string]any{"region": "us-east-1", "endpoint": url, "access_key_id": "bench", "secret_access_key": "bench-secret"}}
	b, _ := json.Marshal(cfg)
	cfgPath := filepath.Join(dir, "cpi.json")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		return err
	}
	img := filepath.Join(dir, "image")
	raw := make([]byte, 1<<20)
	copy(raw, "bench disk")
	if err := os.WriteFile(img, raw, 0o600); err != nil {
		return err
	}
	c := &cpiclient.Client{Path: cpiPath, ConfigPath: cfgPath, DirectorUUID: "bench", APIVersion: 2, StemcellAPIVersion: 2, Timeout: 5 * time.Minute}
	ctx := context.Background()
	type sample struct {
		d    time.Duration
		reqs int64
	}
	samples := map[string][]sample{}
	var order []string
	callOK := func(method string, args ...any) (json.RawMessage, error) {
		before := p.Requests()
		r, err := c.Call(ctx, method, "", args...)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", method, err)
		}
		if _, ok := samples[method]; !ok {
			order = append(order, method)
		}
		samples[method] = append(samples[method], sample{r.Duration, p.Requests() - before})
		return r.Result, nil
	}
	fmt.Printf("bin/cpi: %s, driver aws via %s, %d rounds\n\n", cpiPath, endpoint, n)
	res, err := callOK("create_stemcell", img, map[string]any{"disk": 1024})
	if err != nil {
		return err
	}
	var sc string
	json.Unmarshal(res, &sc)
	props := map[string]any{"instance_type": "t3.micro"}
	nets := map[string]any{"default": map[string]any{"type": "dynamic"}}
	for i := 0; i < n; i++ {
		res, err := callOK("create_vm", "bench-agent", sc, props, nets, []string{}, map[string]any{})
		if err != nil {
			return err
		}
		var pair []json.RawMessage
		json.Unmarshal(res, &pair)
		var vm string
		json.Unmarshal(pair[0], &vm)
		res, err = callOK("create_disk", 1024, map[string]any{}, vm)
		if err != nil {
			return err
		}
		var disk string
		json.Unmarshal(res, &disk)
		for _, step := range []struct {
			m    string
			args []any
		}{{"attach_disk", []any{vm, disk}}, {"detach_disk", []any{vm, disk}}, {"delete_disk", []any{disk}}, {"delete_vm", []any{vm}}} {
			if _, err := callOK(step.m, step.args...); err != nil {
				return err
			}
		}
	}
	if _, err := callOK("delete_stemcell", sc); err != nil {
		return err
	}
	fmt.Printf("%-18s %12s %12s %10s %10s\n", "method", "median ms", "p90 ms", "requests", "max req")
	for _, m := range order {
		s := samples[m]
		sort.Slice(s, func(i, j int) bool { return s[i].d < s[j].d })
		reqs := make([]int64, len(s))
		for i := range s {
			reqs[i] = s[i].reqs
		}
		sort.Slice(reqs, func(i, j int) bool { return reqs[i] < reqs[j] })
		q := func(f float64) float64 { return float64(s[int(f*float64(len(s)-1))].d.Microseconds()) / 1000 }
		fmt.Printf("%-18s %12.1f %12.1f %10d %10d\n", m, q(0.5), q(0.9), reqs[len(reqs)/2], reqs[len(reqs)-1])
	}
	return nil
}
