package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/runway-cpi/runway/src/rpc"
	"github.com/runway-cpi/runway/src/testkit/cpibin"
)

type handed struct {
	driver  string
	args    []string
	request []byte
}

func runWith(t *testing.T, cfg, request string, env map[string]string) (string, *handed) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	var args []string
	if cfg != "" {
		path := filepath.Join(t.TempDir(), "cpi.json")
		os.WriteFile(path, []byte(cfg), 0o600)
		args = []string{"-configPath", path}
	}
	var got *handed
	var out, errOut bytes.Buffer
	code := run(args, strings.NewReader(request), &out, &errOut, func(driver string, args []string, request []byte) error {
		got = &handed{driver, args, request}
		return errors.New("exec refused in the test")
	})
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	return out.String(), got
}

const info = `{"method":"info","arguments":[],"context":{"director_uuid":"d","request_id":"cpi-1"},"api_version":1}`

// bin/cpi answers a plain info itself and hands everything else, byte for
// byte, to the executable of the config's driver.
func TestWhatBinCpiAnswersAndWhatItHandsOver(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg, request string
		env          map[string]string
		answer       string // "" : handed over to driver
		driver       string
	}{
		"info, no config":         {"", info, nil, `"stemcell_formats":["runway-local","warden-tar","general-tar"]`, ""},
		"info, local formats set": {`{"driver":"local","state_dir":"/x","local":{"stemcell_formats":["mine"]}}`, info, nil, `"stemcell_formats":["mine"]`, ""},
		"info, openstack":         {`{"driver":"openstack","state_dir":"/x","openstack":{"auth_url":"u"}}`, info, nil, `"openstack-raw"`, ""},
		"info, aws":               {`{"driver":"aws","state_dir":"/x"}`, info, nil, `"aws-light"`, ""},
		"info without api_version": {`{"driver":"aws","state_dir":"/x"}`, `{"method":"info","arguments":[],"context":{"director_uuid":"d"}}`, nil,
			`"api_version":3`, ""},
		"another method":  {`{"driver":"aws","state_dir":"/x"}`, `{"method":"has_vm","arguments":["i-1"],"context":{"director_uuid":"d"}}`, nil, "", "aws"},
		"info with hooks": {`{"driver":"local","state_dir":"/x","hooks":{"dir":"/h"}}`, info, nil, "", "local"},
		"info with overrides": {`{"driver":"openstack","state_dir":"/x"}`, `{"method":"info","arguments":[],"context":{"director_uuid":"d","auth_url":"x"}}`, nil,
			"", "openstack"},
		"info, bad arguments":   {`{"driver":"local","state_dir":"/x"}`, `{"method":"info","arguments":[1],"context":{"director_uuid":"d"}}`, nil, "", "local"},
		"info, no uuid":         {`{"driver":"local","state_dir":"/x"}`, `{"method":"info","arguments":[],"context":{}}`, nil, "", "local"},
		"info, bad api":         {`{"driver":"local","state_dir":"/x"}`, `{"method":"info","arguments":[],"context":{"director_uuid":"d"},"api_version":2.5}`, nil, "", "local"},
		"malformed request":     {`{"driver":"aws","state_dir":"/x"}`, `{"method":`, nil, "", "aws"},
		"official config shape": {`{"cloud":{"plugin":"openstack","properties":{}}}`, info, nil, `"openstack-raw"`, ""},
		"garm":                  {`{"driver":"aws","state_dir":"/x"}`, "", map[string]string{"GARM_COMMAND": "ListInstances"}, "", "local"},
	} {
		t.Run(name, func(t *testing.T) {
			out, got := runWith(t, tc.cfg, tc.request, tc.env)
			if tc.answer != "" {
				if got != nil || !strings.Contains(out, tc.answer) {
					t.Fatalf("answered %q, handed over %+v; want an answer with %s", out, got, tc.answer)
				}
				r, err := rpc.ParseReply([]byte(out))
				if err != nil || r.Error != nil {
					t.Fatalf("answer %q: %v", out, err)
				}
				return
			}
			if got == nil || got.driver != tc.driver {
				t.Fatalf("handed over %+v; want driver %s", got, tc.driver)
			}
			if tc.env == nil && string(got.request) != tc.request {
				t.Fatalf("handed over request %q; want it unchanged", got.request)
			}
			// The exec failed in the test: the caller still gets a CpiError.
			r, err := rpc.ParseReply([]byte(out))
			if err != nil || r.Error == nil || r.Error.Type != rpc.TypeCpiError || !strings.Contains(r.Error.Message, "cpi-"+tc.driver) {
				t.Fatalf("after a failed exec: %q (%v)", out, err)
			}
		})
	}
}

// An invalid config is a CpiError naming the field, for info too: bin/cpi
// reads it with the config package every executable uses.
func TestInvalidConfigsAreRefusedForInfoToo(t *testing.T) {
	for cfg, want := range map[string]string{
		`null`:       "must be a JSON object, got null",
		`{"driver":`: "invalid JSON",
		`{"driver":"local","state_dir":"/x","stat":1}`:           `unknown key "stat"`,
		`{"driver":"local","state_dir":"rel/dir"}`:               "state_dir: must be an absolute path",
		`{"driver":"local","state_dir":"/x","log_level":"loud"}`: "log_level",
		`{"driver":"vcloud","state_dir":"/x"}`:                   `driver: unknown driver "vcloud"`,
	} {
		out, got := runWith(t, cfg, info, nil)
		r, err := rpc.ParseReply([]byte(out))
		if err != nil || got != nil || r.Error == nil || r.Error.Type != rpc.TypeCpiError || !strings.Contains(r.Error.Message, want) {
			t.Errorf("%s: answered %q (handed over: %v); want a CpiError saying %q", cfg, out, got != nil, want)
		}
	}
	// A FIFO as the config file: an answer at once, not a hang.
	fifo := filepath.Join(t.TempDir(), "cpi.json")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	run([]string{"-configPath", fifo}, strings.NewReader(info), &out, io.Discard, nil)
	if r, err := rpc.ParseReply(out.Bytes()); err != nil || r.Error == nil || !strings.Contains(r.Error.Message, "is not a regular file") {
		t.Errorf("fifo config: %q", out.String())
	}
}

// Through the real executables: bin/cpi's own info answer is the driver
// executable's, and other calls reach the driver executable with their
// request intact.
func TestBinCpiAndTheDriverExecutablesAgree(t *testing.T) {
	bin, err := cpibin.Path()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for driver, section := range map[string]string{"local": `{}`,
		"openstack": `{"auth_url":"http://127.0.0.1:9/v3","username":"u","password":"p","project_name":"x"}`,
		"aws":       `{"region":"us-east-1","access_key_id":"a","secret_access_key":"b"}`} {
		cfg := filepath.Join(dir, driver+".json")
		os.WriteFile(cfg, []byte(`{"driver":"`+driver+`","state_dir":"`+dir+`/state","`+driver+`":`+section+`}`), 0o600)
		answer := func(exe, request string) *rpc.Reply {
			cmd := exec.Command(exe, "-configPath", cfg)
			cmd.Stdin = strings.NewReader(request)
			cmd.Env = []string{"PATH=/usr/bin:/bin"}
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%s: %v", exe, err)
			}
			r, err := rpc.ParseReply(out)
			if err != nil {
				t.Fatalf("%s: %v", exe, err)
			}
			return r
		}
		fast, full := answer(bin, info), answer(filepath.Join(filepath.Dir(bin), "cpi-"+driver), info)
		if string(fast.Result) != string(full.Result) {
			t.Errorf("%s: bin/cpi answers info %s, cpi-%s %s", driver, fast.Result, driver, full.Result)
		}
		r := answer(bin, `{"method":"has_vm","arguments":["no/such"],"context":{"director_uuid":"d"}}`)
		if r.Error == nil || r.Error.Type != rpc.TypeCpiError || !strings.Contains(r.Log, "[") {
			t.Errorf("%s: has_vm through bin/cpi: %+v", driver, r)
		}
	}
}
