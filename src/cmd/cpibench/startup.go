package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"
)

// runStartup measures bin/cpi's `info`, whole process, beside the
// physical floor: an empty static Go program, run the same way in the
// same loop (round robin, so both see the same machine).
func runStartup(cpiPath string, n int, drivers []string) error {
	dir, err := os.MkdirTemp("", "cpibench-startup-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		return err
	}
	build := exec.Command("go", "build", "-trimpath", "-o", empty, "main.go")
	build.Dir = dir
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GO111MODULE=off")
	if out, err := build.CombinedOutput(); err != nil {
		return fmt.Errorf("building the empty program: %v\n%s", err, out)
	}
	configs := map[string]string{
		"local":     `{"driver":"local","state_dir":%q}`,
		"openstack": `{"driver":"openstack","state_dir":%q,"openstack":{"auth_url":"http://127.0.0.1:9/v3","username":"u","password":"p","project_name":"x"}}`,
		"aws":       `{"driver":"aws","state_dir":%q,"aws":{"region":"us-east-1","access_key_id":"a","secret_access_key":"b"}}`,
	}
	type variant struct {
		name string
		argv []string
	}
	variants := []variant{{"empty static Go program", []string{empty}}}
	for _, d := range drivers {
		cfg := filepath.Join(dir, d+".json")
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(configs[d], filepath.Join(dir, "state"))), 0o600); err != nil {
			return err
		}
		variants = append(variants, variant{"info, " + d + " config", []string{cpiPath, "-configPath", cfg}})
	}
	stdin := []byte(`{"method":"info","arguments":[],"context":{"director_uuid":"bench"},"api_version":1}`)
	times := make([][]time.Duration, len(variants))
	for i := 0; i < n+10; i++ {
		for v, vr := range variants {
			cmd := exec.Command(vr.argv[0], vr.argv[1:]...)
			cmd.Stdin = bytes.NewReader(stdin)
			cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin"}
			start := time.Now()
			out, err := cmd.Output()
			took := time.Since(start)
			if err != nil {
				return fmt.Errorf("%s: %v", vr.name, err)
			}
			if v > 0 && !bytes.Contains(out, []byte(`"stemcell_formats"`)) {
				return fmt.Errorf("%s answered %s", vr.name, out)
			}
			if i >= 10 { // warm-up
				times[v] = append(times[v], took)
			}
		}
	}
	st, _ := os.Stat(cpiPath)
	fmt.Printf("start-up: %s (%.1f MB), %d rounds\n", cpiPath, float64(st.Size())/1e6, n)
	floor := median(times[0])
	for v, vr := range variants {
		report(vr.name, times[v])
		if v > 0 {
			fmt.Printf("%-40s %.2f× the empty program\n", "", float64(median(times[v]))/float64(floor))
		}
	}
	return nil
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if s[j] < s[i] {
				s[i], s[j] = s[j], s[i]
			}
		}
	}
	return s[len(s)/2]
}
