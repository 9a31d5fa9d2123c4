// Package integration is the lifecycle suite: it builds bin/cpi once and
// drives it as a subprocess per call, with a real config file and the
// Director's cleared environment. The driver comes from RUNWAY_IT_DRIVER
// (default local); other drivers give their config and fixtures through
// the variables documented in docs/testing.md.
package integration_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/runway-cpi/runway/src/rpc"
	"github.com/runway-cpi/runway/src/testkit/cpibin"
)

func TestIntegration(t *testing.T) {
	RegisterFailHandler(Fail)
	RunSpecs(t, "bin/cpi lifecycle")
}

// fixture is what the suite needs to know about the driver under test.
type fixture struct {
	Driver      string         `json:"driver"`
	ConfigPath  string         `json:"-"`
	StateDir    string         `json:"-"`
	Image       string         `json:"stemcell_image"`
	ImageProps  map[string]any `json:"stemcell_cloud_properties"`
	VMProps     map[string]any `json:"vm_cloud_properties"`
	Networks    map[string]any `json:"networks"`
	DiskProps   map[string]any `json:"disk_cloud_properties"`
	UnknownVM   string         `json:"unknown_vm_cid"`
	UnknownDisk string         `json:"unknown_disk_cid"`
	// UnreachableConfig is a config whose IaaS endpoint is
	// UnreachableEndpoint, which nothing listens on.
	UnreachableConfig   string `json:"unreachable_config"`
	UnreachableEndpoint string `json:"unreachable_endpoint"`
	// Secret is a credential in the config that must never be printed.
	Secret string `json:"secret"`
	// NoSnapshots: the driver answers snapshot_disk NotImplemented (the
	// Kubernetes driver on a cluster without the VolumeSnapshot API).
	NoSnapshots bool `json:"no_snapshots"`
	// IPPool, when set, hands each create_vm its own address for the
	// manual networks in Networks (a fixed IP can be held only once).
	IPPool []string `json:"ip_pool"`
	// Local means the suite may look inside the state dir.
	Local bool `json:"-"`
	// Exec runs bin/cpi (container mode: inside the suite's network
	// namespace); NetNS is that namespace's name.
	Exec  []string `json:"-"`
	NetNS string   `json:"-"`
}

var poolNext atomic.Int64

// networks is the fixture's networks hash for one create_vm, with the
// next pool address on each manual network when the fixture has a pool.
func networks() map[string]any {
	if len(fx.IPPool) == 0 {
		return fx.Networks
	}
	i := int(poolNext.Add(1)-1) % len(fx.IPPool)
	out := make(map[string]any, len(fx.Networks))
	for name, n := range fx.Networks {
		m, ok := n.(map[string]any)
		if ok && m["type"] == "manual" {
			c := make(map[string]any, len(m))
			for k, v := range m {
				c[k] = v
			}
			c["ip"] = fx.IPPool[i]
			n = c
		}
		out[name] = n
	}
	return out
}

var (
	cpiBin string
	fx     fixture
	// localDriver is known when the spec tree is built (from the
	// environment, as loadFixture reads it later).
	localDriver = os.Getenv("RUNWAY_IT_DRIVER") == "" || os.Getenv("RUNWAY_IT_DRIVER") == "local"
	// containerMode: the local driver with isolation "container"
	// (RUNWAY_IT_ISOLATION=container; docs/testing.md).
	containerMode = localDriver && os.Getenv("RUNWAY_IT_ISOLATION") == "container"
)

// describeContainer registers specs for container mode only.
func describeContainer(text string, args ...any) bool {
	if containerMode {
		Describe(text, args...)
	}
	return true
}

// describeLocal, itLocal and itCloud register specs only for the drivers
// they apply to, instead of skipping them at run time.
func describeLocal(text string, body func()) bool {
	if localDriver && !containerMode { // hooks and examples: not about VMs
		Describe(text, body)
	}
	return true
}

func itLocal(text string, body func()) {
	if localDriver {
		It(text, body)
	}
}

func itCloud(text string, body func()) {
	if !localDriver {
		It(text, body)
	}
}

var _ = SynchronizedBeforeSuite(func() []byte {
	driver := os.Getenv("RUNWAY_IT_DRIVER")
	if driver == "" {
		driver = "local"
	}
	bin, err := cpibin.Path(driver, "local") // the examples and hook specs use local
	Expect(err).NotTo(HaveOccurred())
	return []byte(bin)
}, func(bin []byte) {
	cpiBin = string(bin)
	fx = loadFixture()
})

// loadFixture: for local, everything is made here; for other drivers,
// RUNWAY_IT_CONFIG names the CPI config and RUNWAY_IT_FIXTURE a JSON file
// with the fixture fields.
func loadFixture() fixture {
	driver := os.Getenv("RUNWAY_IT_DRIVER")
	if driver == "" || driver == "local" {
		dir, err := os.MkdirTemp("", "runway-it-")
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { os.RemoveAll(dir) })
		f := fixture{Driver: "local", Local: true, StateDir: filepath.Join(dir, "state"),
			ConfigPath: filepath.Join(dir, "cpi.json"), Image: makeImage(dir),
			ImageProps: map[string]any{},
			// The VM writes to its stdout: none of it may reach bin/cpi's.
			VMProps:   map[string]any{"command": "echo vm-output-on-stdout; echo vm-output-on-stderr >&2; exec sleep 600"},
			Networks:  map[string]any{"default": map[string]any{"type": "dynamic", "default": []string{"dns", "gateway"}}},
			DiskProps: map[string]any{},
			UnknownVM: "vm-00000000-0000-0000-0000-000000000000", UnknownDisk: "disk-00000000-0000-0000-0000-000000000000"}
		local := map[string]any{"stop_grace_seconds": 2}
		if containerMode {
			setupContainerMode(&f, dir, local)
		}
		cfg := map[string]any{"driver": "local", "state_dir": f.StateDir, "log_level": "debug", "local": local}
		b, _ := json.Marshal(cfg)
		Expect(os.WriteFile(f.ConfigPath, b, 0o600)).To(Succeed())
		return f
	}
	var f fixture
	b, err := os.ReadFile(os.Getenv("RUNWAY_IT_FIXTURE"))
	Expect(err).NotTo(HaveOccurred(), "RUNWAY_IT_FIXTURE must name the fixture file for driver "+driver)
	Expect(json.Unmarshal(b, &f)).To(Succeed())
	f.Driver = driver
	f.ConfigPath = os.Getenv("RUNWAY_IT_CONFIG")
	Expect(f.ConfigPath).NotTo(BeEmpty(), "RUNWAY_IT_CONFIG must name the CPI config")
	return f
}

func makeImage(dir string) string {
	p := filepath.Join(dir, "image")
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	body := []byte("root image")
	Expect(tw.WriteHeader(&tar.Header{Name: "root.img", Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})).To(Succeed())
	tw.Write(body)
	tw.Close()
	gz.Close()
	Expect(os.WriteFile(p, buf.Bytes(), 0o600)).To(Succeed())
	return p
}

// Response is the wire response as the Director reads it.
// Response is one answer of the real bin/cpi: the wire reply (validated by
// rpc.ParseReply as the Director would) and what went to stderr.
type Response struct {
	rpc.Reply
	Stderr string
}

// directorEnv is the environment the Director gives a CPI.
func directorEnv() []string {
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "TMPDIR=" + os.TempDir(), "HOME=" + os.Getenv("HOME")}
	if v, ok := os.LookupEnv("RUNWAY_IT_SECRET"); ok { // a spec's stand-in for a credential
		env = append(env, "RUNWAY_IT_SECRET="+v)
	}
	return env
}

// runRaw runs bin/cpi once with stdin and checks the process contract:
// exit 0, exactly one JSON document on stdout, log a string.
func runRaw(stdin string) Response { return runWith(fx.ConfigPath, stdin) }

// runWith is runRaw with an explicit config file.
func runWith(configPath, stdin string) Response {
	argv := append(append([]string{}, fx.Exec...), cpiBin, "-configPath", configPath)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = directorEnv()
	cmd.Stdin = strings.NewReader(stdin)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	ExpectWithOffset(3, err).NotTo(HaveOccurred(), "bin/cpi exited non-zero; stderr:\n%s", stderr.String())
	reply, err := rpc.ParseReply(stdout.Bytes())
	ExpectWithOffset(3, err).NotTo(HaveOccurred(), "stdout is not exactly one valid response")
	r := Response{Reply: *reply}
	r.Stderr = stderr.String()
	return r
}

func request(method string, api int, args ...any) string {
	req, err := rpc.NewRequest(method, api, map[string]any{"director_uuid": "it-director", "request_id": "cpi-424242",
		"vm": map[string]any{"stemcell": map[string]any{"api_version": 2}}}, args...)
	Expect(err).NotTo(HaveOccurred())
	b, err := json.Marshal(req)
	Expect(err).NotTo(HaveOccurred())
	return string(b)
}

// call runs a method at API v2 and expects success.
func call(method string, args ...any) json.RawMessage {
	return callV(2, method, args...)
}

// maxVMCreateTries is the Director's max_vm_create_tries default: it calls
// create_vm again while the answer is a VMCreationFailed with ok_to_retry
// (create_vm_step.rb), so a VM the cloud put in ERROR once is not a failed
// deployment, and is not a failed spec here either.
const maxVMCreateTries = 5

func callV(api int, method string, args ...any) json.RawMessage {
	r := runRaw(request(method, api, args...))
	for tries := 1; method == "create_vm" && r.Error != nil && r.Error.Type == "Bosh::Clouds::VMCreationFailed" &&
		r.Error.OkToRetry && tries < maxVMCreateTries; tries++ {
		fmt.Fprintf(GinkgoWriter, "create_vm failed (try %d): %s; trying again as the Director does\n", tries, r.Error.Message)
		r = runRaw(request(method, api, args...))
	}
	ExpectWithOffset(1, r.Error).To(BeNil(), "%s failed: %+v\nlog:\n%s", method, r.Error, r.Log)
	return r.Result
}

// callErr runs a method and expects an error of the given type.
func callErr(wantType string, method string, args ...any) Response {
	r := runRaw(request(method, 2, args...))
	ExpectWithOffset(1, r.Error).NotTo(BeNil(), "%s succeeded, want %s", method, wantType)
	ExpectWithOffset(1, r.Error.Type).To(Equal(wantType), "%s: %s", method, r.Error.Message)
	return r
}

func asString(raw json.RawMessage) string {
	var s string
	ExpectWithOffset(1, json.Unmarshal(raw, &s)).To(Succeed(), "result %s is not a string", raw)
	return s
}

func asBool(raw json.RawMessage) bool {
	var b bool
	ExpectWithOffset(1, json.Unmarshal(raw, &b)).To(Succeed(), "result %s is not a boolean", raw)
	return b
}

// cleanUp deletes a spec's resource in its clean-up. Gone already is
// fine (the spec deleted it). Any other failure is kept and named by the
// leftover checks (cleanUpFailures), so a resource left behind points to
// the spec that made it; it does not stop the rest of the clean-up.
func cleanUp(method string, cid any) {
	if cid == "" {
		return
	}
	r := runRaw(request(method, 2, cid))
	if r.Error != nil && !strings.HasSuffix(r.Error.Type, "NotFound") {
		msg := fmt.Sprintf("clean-up in %q: %s %v: %s: %s", CurrentSpecReport().FullText(), method, cid, r.Error.Type, r.Error.Message)
		fmt.Fprintln(GinkgoWriter, msg)
		cleanUps.Lock()
		cleanUps.failed = append(cleanUps.failed, msg)
		cleanUps.Unlock()
	}
}

var cleanUps struct {
	sync.Mutex
	failed []string
}

// cleanUpFailures names the clean-ups that failed so far, for a leftover
// check's failure message.
func cleanUpFailures() string {
	cleanUps.Lock()
	defer cleanUps.Unlock()
	if len(cleanUps.failed) == 0 {
		return "no clean-up failed so far"
	}
	return "failed clean-ups so far:\n" + strings.Join(cleanUps.failed, "\n")
}
