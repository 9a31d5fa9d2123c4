package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/cpiclient"
	"github.com/runway-cpi/runway/src/testkit/faultproxy"
)

// cloudSuite says how to drive one IaaS driver against a real API.
type cloudSuite struct {
	driver  string
	target  string // what the counting proxy forwards to
	dialect faultproxy.Dialect
	// config is the driver's section, given the proxy's URL.
	config        func(proxyURL string) map[string]any
	stemcellProps map[string]any
	vmProps       map[string]any
	nets          map[string]any
	// coldFirst: clear the driver's caches in the state dir before the
	// first create_vm, so one sample pays for the login.
	coldFirst string
}

func awsSuite(endpoint string) (cloudSuite, error) {
	if endpoint == "" {
		return cloudSuite{}, fmt.Errorf("-suite aws needs -endpoint")
	}
	return cloudSuite{driver: "aws", target: endpoint, dialect: faultproxy.AWS,
		config: func(u string) map[string]any {
			return map[string]any{"region": "us-east-1", "endpoint": u, "access_key_id": "bench", "secret_access_key": "bench-secret"}
		},
		stemcellProps: map[string]any{"disk": 1024}, vmProps: map[string]any{"instance_type": "t3.micro"},
		nets: map[string]any{"default": map[string]any{"type": "dynamic"}}}, nil
}

// openstackSuite reads the dev cloud's openrc variables (OS_*) and
// RUNWAY_OS_NET_ID / RUNWAY_OS_FLAVOR from its fixtures.env.
func openstackSuite() (cloudSuite, error) {
	auth := os.Getenv("OS_AUTH_URL")
	if auth == "" || os.Getenv("RUNWAY_OS_NET_ID") == "" {
		return cloudSuite{}, fmt.Errorf("-suite openstack needs the dev cloud's openrc and fixtures.env in the environment")
	}
	u, err := url.Parse(auth)
	if err != nil {
		return cloudSuite{}, err
	}
	return cloudSuite{driver: "openstack", target: u.Scheme + "://" + u.Host, dialect: faultproxy.OpenStack,
		config: func(p string) map[string]any {
			return map[string]any{"auth_url": p + u.Path, "username": os.Getenv("OS_USERNAME"), "password": os.Getenv("OS_PASSWORD"),
				"project_name": os.Getenv("OS_PROJECT_NAME"), "region": os.Getenv("OS_REGION_NAME")}
		},
		stemcellProps: map[string]any{"disk_format": "raw"}, vmProps: map[string]any{"instance_type": os.Getenv("RUNWAY_OS_FLAVOR")},
		nets:      map[string]any{"default": map[string]any{"type": "dynamic", "cloud_properties": map[string]any{"net_id": os.Getenv("RUNWAY_OS_NET_ID")}}},
		coldFirst: "openstack-"}, nil
}

// runCloud measures the Director's disk and VM calls against an IaaS API:
// whole-process wall time and HTTP requests per call, counted by a
// pass-through proxy in front of the API.
func runCloud(cpiPath string, s cloudSuite, n int) error {
	p, err := faultproxy.New(s.target, s.dialect)
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
	state := filepath.Join(dir, "state")
	cfg := map[string]any{"driver": s.driver, "state_dir": state, s.driver: s.config(url)}
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
	fmt.Printf("bin/cpi: %s, driver %s via %s, %d rounds\n\n", cpiPath, s.driver, s.target, n)
	res, err := callOK("create_stemcell", img, s.stemcellProps)
	if err != nil {
		return err
	}
	var sc string
	json.Unmarshal(res, &sc)
	props, nets := s.vmProps, s.nets
	for i := 0; i < n; i++ {
		if i == 0 && s.coldFirst != "" {
			if err := clearCaches(state, s.coldFirst); err != nil {
				return err
			}
		}
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
	fmt.Printf("%-18s %12s %12s %12s %10s %10s\n", "method", "median ms", "p90 ms", "max ms", "requests", "max req")
	for _, m := range order {
		s := samples[m]
		sort.Slice(s, func(i, j int) bool { return s[i].d < s[j].d })
		reqs := make([]int64, len(s))
		for i := range s {
			reqs[i] = s[i].reqs
		}
		sort.Slice(reqs, func(i, j int) bool { return reqs[i] < reqs[j] })
		q := func(f float64) float64 { return float64(s[int(f*float64(len(s)-1))].d.Microseconds()) / 1000 }
		fmt.Printf("%-18s %12.1f %12.1f %12.1f %10d %10d\n", m, q(0.5), q(0.9), q(1), reqs[len(reqs)/2], reqs[len(reqs)-1])
	}
	return nil
}

// clearCaches removes the driver's cache files (token, flavors) from the
// state dir, so the next call starts as a brand-new machine would.
func clearCaches(state, prefix string) error {
	entries, err := os.ReadDir(state)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) && strings.HasSuffix(e.Name(), ".json") {
			if err := os.Remove(filepath.Join(state, e.Name())); err != nil {
				return err
			}
		}
	}
	return nil
}
