package openstack

// These tests run against a real OpenStack control plane (scripts/
// openstack-dev), named by the standard OS_* variables of its openrc plus
// RUNWAY_OS_NET_ID (fixtures.env); scripts/test starts one. The admin
// credentials (RUNWAY_OS_ADMIN_PASSWORD, same user domain) audit leftovers.

import (
	"bytes"
	"context"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gophercloud/gophercloud/v2"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/drivertest"
	"github.com/runway-cpi/runway/src/retry"
	"github.com/runway-cpi/runway/src/testkit/faultproxy"
	"github.com/runway-cpi/runway/src/testkit/testenv"
	"github.com/runway-cpi/runway/src/testkit/testlog"
)

type cloud struct {
	authURL, user, password, project, region, netID string
}

func devCloud(t *testing.T) cloud {
	t.Helper()
	v := testenv.Need(t, "source $OS_DEV_DIR/openrc and fixtures.env after scripts/openstack-dev start; scripts/test does this",
		"OS_AUTH_URL", "OS_USERNAME", "OS_PASSWORD", "OS_PROJECT_NAME", "OS_REGION_NAME", "RUNWAY_OS_NET_ID")
	return cloud{authURL: v[0], user: v[1], password: v[2], project: v[3], region: v[4], netID: v[5]}
}

// newTestDriver builds a driver on the dev cloud (authURL overrides, for
// the proxy) with its state dir (shared when given, like processes do).
func newTestDriver(t *testing.T, c cloud, authURL, stateDir string, extra map[string]any) (*Driver, *testlog.Buffer) {
	t.Helper()
	if stateDir == "" {
		stateDir = t.TempDir()
	}
	if authURL == "" {
		authURL = c.authURL
	}
	deps, logs := drivertest.Deps(t, filepath.Join(stateDir, "locks"))
	deps.StateDir = stateDir
	cfg := map[string]any{"auth_url": authURL, "username": c.user, "password": c.password, "project_name": c.project,
		"region": c.region, "wait_timeout_seconds": 60}
	d, err := New(drivertest.Section(cfg, extra), deps)
	if err != nil {
		t.Fatal(err)
	}
	return d, logs
}

func rawImage(t *testing.T) (string, driver.Props) {
	p := filepath.Join(t.TempDir(), "root.img")
	if err := os.WriteFile(p, bytes.Repeat([]byte{0}, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	return p, driver.PropsOf(map[string]any{"name": "bosh-openstack-kvm-ubuntu-jammy-go_agent", "version": "1.0", "disk_format": "raw"})
}

func fixture(c cloud, authURL string) drivertest.Fixture {
	return drivertest.Fixture{
		New: func(t *testing.T) driver.Driver {
			d, _ := newTestDriver(t, c, authURL, "", nil)
			return d
		},
		StemcellImage: rawImage,
		VMProps:       driver.PropsOf(map[string]any{"instance_type": "runway.tiny"}),
		Networks: driver.Networks{"runners": {Type: "dynamic", Default: []string{"dns", "gateway"},
			CloudProperties: driver.PropsOf(map[string]any{"net_id": c.netID})}},
		DiskProps: driver.Props{},
		UnknownVM: uuid.NewString(), UnknownDisk: uuid.NewString(),
	}
}

func TestConformance(t *testing.T) {
	c := devCloud(t)
	t.Cleanup(func() { assertNoLeftovers(t, c, "drivertest") })
	drivertest.Run(t, fixture(c, ""))
}

// createStemcell uploads the raw fixture image and deletes it at cleanup.
// driverWithStemcell is a driver on c with the test stemcell, c checked
// at the test's end to hold nothing the test made.
func driverWithStemcell(t *testing.T, c cloud, extra map[string]any) (*Driver, *testlog.Buffer, string) {
	d, logs := newTestDriver(t, c, "", "", extra)
	t.Cleanup(func() { assertNoLeftovers(t, c, "os-test") })
	return d, logs, createStemcell(t, d)
}

func createStemcell(t *testing.T, d *Driver) string {
	t.Helper()
	img, props := rawImage(t)
	sc, err := d.CreateStemcell(context.Background(), driver.StemcellSpec{ImagePath: img, CloudProps: props,
		Tags: map[string]string{"created_by": "os-test"}})
	if err != nil {
		t.Fatalf("create_stemcell: %v", err)
	}
	t.Cleanup(func() { _ = d.DeleteStemcell(context.Background(), sc) })
	return sc
}

func TestNetworksNoneAndManual(t *testing.T) {
	c := devCloud(t)
	ctx := context.Background()
	d, _, sc := driverWithStemcell(t, c, nil)
	tags := map[string]string{"created_by": "os-test", "director": "os-test-director"}

	vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "agent-none", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"instance_type": "runway.tiny"}),
		Tags: tags, AgentSettings: []byte(`{"agent_id":"agent-none"}`)})
	if err != nil {
		t.Fatalf("create_vm with no networks: %v", err)
	}
	if len(vm.Networks) != 0 {
		t.Errorf("networks none answered %v", vm.Networks)
	}
	if err := d.DeleteVM(ctx, vm.CID); err != nil {
		t.Fatal(err)
	}

	nets := driver.Networks{"private": {Type: "manual", IP: "10.20.0.77", Netmask: "255.255.255.0", Gateway: "10.20.0.1",
		Default: []string{"gateway"}, CloudProperties: driver.PropsOf(map[string]any{"net_id": c.netID})}}
	vm, err = d.CreateVM(ctx, driver.VMSpec{AgentID: "agent-manual", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"instance_type": "runway.tiny"}),
		Networks: nets, Tags: tags})
	if err != nil {
		t.Fatalf("create_vm on a manual network: %v", err)
	}
	if got := vm.Networks["private"].IP; got != "10.20.0.77" {
		t.Errorf("manual network answered ip %q", got)
	}
	a := newAdmin(t, c)
	ps := a.ports(t, "device_id="+vm.CID)
	if len(ps) != 1 || ps[0].FixedIP() != "10.20.0.77" {
		t.Fatalf("server %s ports = %+v; want one port holding 10.20.0.77", vm.CID, ps)
	}
	if !containsAll(ps[0].Tags, "created_by=os-test", "agent_id=agent-manual") {
		t.Errorf("port tags %v lack the creator tags", ps[0].Tags)
	}
	// The Director's metadata names its director (a name, not the uuid
	// the creator tags hold): delete_vm must still find the port.
	if err := d.SetVMMetadata(ctx, vm.CID, map[string]string{"director": "bosh-lite", "agent_id": "renamed", "name": "web/0"}); err != nil {
		t.Fatal(err)
	}
	// human_readable_vm_names is off: the server keeps create_vm's name.
	if srv, err := a.get(t, "compute", "/servers/"+vm.CID); err != nil || srv["server"].(map[string]any)["name"] == "web/0" {
		t.Errorf("set_vm_metadata renamed the server without human_readable_vm_names: %v %v", srv, err)
	}
	if err := d.DeleteVM(ctx, vm.CID); err != nil {
		t.Fatal(err)
	}
	if left := a.ports(t, "fixed_ips=ip_address%3D10.20.0.77"); len(left) != 0 {
		t.Fatalf("delete_vm left the port %+v", left)
	}
}

func containsAll(have []string, want ...string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			found = found || h == w
		}
		if !found {
			return false
		}
	}
	return true
}

// TestErrorPaths: bad credentials, unknown flavor, image and network all
// fail with the cloud's reason and leave nothing behind.
func TestErrorPaths(t *testing.T) {
	c := devCloud(t)
	ctx := context.Background()
	bad, _ := newTestDriver(t, c, "", "", map[string]any{"password": "wrong-password"})
	_, err := bad.HasVM(ctx, uuid.NewString())
	if err == nil || !strings.Contains(err.Error(), c.authURL) || !strings.Contains(err.Error(), "401") {
		t.Errorf("bad credentials: %v; want an error naming %s and 401", err, c.authURL)
	}
	if err != nil && strings.Contains(err.Error(), "wrong-password") {
		t.Errorf("the password leaked into the error: %v", err)
	}

	d, _ := newTestDriver(t, c, "", "", nil)
	t.Cleanup(func() { assertNoLeftovers(t, c, "os-errors") })
	sc := createStemcell(t, d)
	tags := map[string]string{"created_by": "os-errors"}
	dyn := driver.Networks{"default": {Type: "dynamic", CloudProperties: driver.PropsOf(map[string]any{"net_id": c.netID})}}
	for name, tc := range map[string]struct {
		spec driver.VMSpec
		want string
	}{
		"unknown flavor": {driver.VMSpec{StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"instance_type": "no-such-flavor"}), Networks: dyn, Tags: tags},
			`flavor "no-such-flavor" not found`},
		"unknown image": {driver.VMSpec{StemcellCID: uuid.NewString(), CloudProps: driver.PropsOf(map[string]any{"instance_type": "runway.tiny"}), Networks: dyn, Tags: tags},
			"mage"},
		"unknown network": {driver.VMSpec{StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"instance_type": "runway.tiny"}), Tags: tags,
			Networks: driver.Networks{"default": {Type: "dynamic", CloudProperties: driver.PropsOf(map[string]any{"net_id": uuid.NewString()})}}},
			"etwork"},
		"unknown network, manual": {driver.VMSpec{StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"instance_type": "runway.tiny"}), Tags: tags,
			Networks: driver.Networks{"default": {Type: "manual", IP: "10.20.0.78", CloudProperties: driver.PropsOf(map[string]any{"net_id": uuid.NewString()})}}},
			"etwork"},
	} {
		_, err := d.CreateVM(ctx, tc.spec)
		var ce *driver.CreationError
		switch {
		case err == nil:
			t.Errorf("%s: create_vm succeeded", name)
		case errors.As(err, &ce) || errors.Is(err, driver.ErrInvalidInput):
			t.Errorf("%s: %v; want a plain cloud error (CloudError on the wire)", name, err)
		case !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), c.authURL):
			t.Errorf("%s: %q; want it to say %q and name %s", name, err, tc.want, c.authURL)
		}
	}
}

// TestTokenCache: the first driver logs in and writes a 0600 cache; a
// later one (another process, in life) works from it without credentials
// Keystone would accept.
func TestTokenCache(t *testing.T) {
	c := devCloud(t)
	ctx := context.Background()
	state := t.TempDir()
	d1, logs1 := newTestDriver(t, c, "", state, nil)
	if _, err := d1.HasVM(ctx, uuid.NewString()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs1.String(), "logged in to Keystone") {
		t.Fatalf("first driver did not log in:\n%s", logs1)
	}
	st, err := os.Stat(d1.cachePath())
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("token cache mode %v; want 0600", st.Mode().Perm())
	}
	raw, _ := os.ReadFile(d1.cachePath())
	if strings.Contains(string(raw), c.password) {
		t.Error("the token cache holds the password")
	}
	d2, logs2 := newTestDriver(t, c, "", state, map[string]any{"password": "not-the-password"})
	if _, err := d2.HasVM(ctx, uuid.NewString()); err != nil {
		t.Fatalf("second driver with the cached token: %v", err)
	}
	if strings.Contains(logs2.String(), "logged in to Keystone") {
		t.Error("second driver logged in although the cache held a fresh token")
	}
}

func TestLightStemcell(t *testing.T) {
	c := devCloud(t)
	ctx := context.Background()
	d, _ := newTestDriver(t, c, "", "", nil)
	img := testenv.Need(t, "fixtures.env of scripts/openstack-dev", "RUNWAY_OS_IMAGE_ID")[0]
	sc, err := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"image_id": img})})
	if err != nil || sc != img+" light" {
		t.Fatalf("light stemcell = %q, %v", sc, err)
	}
	if err := d.DeleteStemcell(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if _, err := newAdmin(t, c).get(t, "image", "v2/images/"+img); err != nil {
		t.Fatalf("deleting a light stemcell touched the image: %v", err)
	}
	if _, err := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"image_id": uuid.NewString()})}); !errors.Is(err, driver.ErrStemcellNotFound) {
		t.Fatalf("light stemcell of a missing image: %v", err)
	}
}

func TestCalculateVMCloudProperties(t *testing.T) {
	c := devCloud(t)
	d, _ := newTestDriver(t, c, "", "", nil)
	ctx := context.Background()
	props, err := d.CalculateVMCloudProperties(ctx, driver.Resources{CPU: 2, RAM: 256, EphemeralDiskSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	got := props.Map()
	// runway.small (2 vCPU, 512 MiB, 2 GiB disk) is the smallest fit, but
	// its disk cannot hold 1 GiB + 3 GiB: boot from a 4 GiB volume.
	// root_disk.size is GiB, as create_vm reads it (and the official CPI).
	if rd, _ := got["root_disk"].(map[string]any); got["instance_type"] != "runway.small" || got["boot_from_volume"] != true || rd["size"] != 4.0 {
		t.Errorf("calculate = %v", got)
	}
	if _, err := d.CalculateVMCloudProperties(ctx, driver.Resources{CPU: 64, RAM: 1 << 20}); err == nil {
		t.Error("a size no flavor has was answered")
	}
}

// throughProxy puts a fault proxy in front of the dev cloud (Keystone and,
// by catalog rewriting, every service) and returns its auth URL.
func throughProxy(t *testing.T, c cloud, rule faultproxy.Rule) (string, *faultproxy.Proxy) {
	t.Helper()
	u, err := url.Parse(c.authURL)
	if err != nil {
		t.Fatal(err)
	}
	p, err := faultproxy.New(u.Scheme+"://"+u.Host, faultproxy.OpenStack)
	if err != nil {
		t.Fatal(err)
	}
	p.SetRule(rule)
	base, stop := p.Start()
	t.Cleanup(stop)
	return base + u.Path, p
}

var allFaults = []faultproxy.Fault{faultproxy.Throttle, faultproxy.ServerError, faultproxy.ResetBefore, faultproxy.ResetAfter}

// TestConformanceThroughFaults runs the whole conformance suite with a
// fifth of all requests (Keystone's included) throttled with 413/429 and
// Retry-After, failed with 503, or reset before or after the cloud acted:
// no call may fail and nothing may be left behind.
func TestConformanceThroughFaults(t *testing.T) {
	c := devCloud(t)
	t.Cleanup(func() { assertNoLeftovers(t, c, "drivertest") })
	seed := uint64(11)
	if v, err := strconv.ParseUint(os.Getenv("FAULT_SEED"), 10, 64); err == nil {
		seed = v
	}
	t.Logf("fault seed %d (FAULT_SEED replays it)", seed)
	authURL, p := throughProxy(t, c, faultproxy.Random(0.2, seed, allFaults...))
	t.Cleanup(func() {
		t.Logf("%d requests: %d throttled, %d 5xx, %d reset before, %d reset after", p.Requests(),
			p.Faults(faultproxy.Throttle), p.Faults(faultproxy.ServerError), p.Faults(faultproxy.ResetBefore), p.Faults(faultproxy.ResetAfter))
		for _, f := range allFaults {
			if p.Faults(f) == 0 {
				t.Errorf("no %s fault was injected: the test proves nothing about it", f)
			}
		}
	})
	drivertest.Run(t, fixture(c, authURL))
}

// TestThrottleHonoursRetryAfter: throttled answers are waited out for at
// least their Retry-After, and each wait is in the log.
func TestThrottleHonoursRetryAfter(t *testing.T) {
	c := devCloud(t)
	// Throttle the first three server reads, then pass.
	var n atomic.Int32
	authURL, p := throughProxy(t, c, func(r faultproxy.Request) faultproxy.Fault {
		if r.Method == "GET" && strings.Contains(r.URL.Path, "/servers/") && n.Add(1) <= 3 {
			return faultproxy.Throttle
		}
		return faultproxy.Pass
	})
	d, logs := newTestDriver(t, c, authURL, "", nil)
	start := time.Now()
	if ok, err := d.HasVM(context.Background(), uuid.NewString()); err != nil || ok {
		t.Fatalf("has_vm through throttles = %v, %v", ok, err)
	}
	if waited := time.Since(start); waited < 3*time.Second {
		t.Errorf("three throttles with Retry-After: 1 were waited out in %s", waited)
	}
	if got := strings.Count(logs.String(), "throttled"); got < 3 || p.Faults(faultproxy.Throttle) != 3 {
		t.Errorf("%d throttles, %d logged waits:\n%s", p.Faults(faultproxy.Throttle), got, logs)
	}
}

// TestThrottleOutlastingTheBudget says so, never "unknown error".
func TestThrottleOutlastingTheBudget(t *testing.T) {
	c := devCloud(t)
	authURL, _ := throughProxy(t, c, func(r faultproxy.Request) faultproxy.Fault {
		if strings.Contains(r.URL.Path, "/servers/") {
			return faultproxy.Throttle
		}
		return faultproxy.Pass
	})
	d, _ := newTestDriver(t, c, authURL, "", nil)
	d.Retry.Budget = 2 * time.Second
	_, err := d.HasVM(context.Background(), uuid.NewString())
	if err == nil || !strings.Contains(err.Error(), "rate limited") || !errors.Is(err, retry.ErrBudgetExhausted) {
		t.Fatalf("has_vm throttled past the budget: %v", err)
	}
}

// TestConcurrentProcessesLogInOnce: drivers sharing a state dir (bin/cpi
// processes, in life) with no cached token make one Keystone login.
func TestConcurrentProcessesLogInOnce(t *testing.T) {
	c := devCloud(t)
	var logins atomic.Int32
	authURL, _ := throughProxy(t, c, func(r faultproxy.Request) faultproxy.Fault {
		if r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/auth/tokens") {
			logins.Add(1)
		}
		return faultproxy.Pass
	})
	state := t.TempDir()
	var wg sync.WaitGroup
	errs := make(chan error, 6)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, _ := newTestDriver(t, c, authURL, state, nil)
			_, err := d.HasVM(context.Background(), uuid.NewString())
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if got := logins.Load(); got != 1 {
		t.Fatalf("6 concurrent drivers made %d Keystone logins; want 1", got)
	}
}

// human_readable_vm_names renames servers as the official CPI does: the
// instance name, else job/index, else compiling/<package>.
func TestHumanReadableVMNames(t *testing.T) {
	c := devCloud(t)
	ctx := context.Background()
	d, _, sc := driverWithStemcell(t, c, map[string]any{"human_readable_vm_names": true})
	vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "agent-named", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"instance_type": "runway.tiny"}),
		Tags: map[string]string{"created_by": "os-test", "director": "os-test-director"}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteVM(ctx, vm.CID)
	a := newAdmin(t, c)
	for _, tc := range []struct {
		md   map[string]string
		want string
	}{
		{map[string]string{"compiling": "golang"}, "compiling/golang"},
		{map[string]string{"job": "web", "index": "2"}, "web/2"},
		{map[string]string{"name": "web/5f0c", "job": "web", "index": "2"}, "web/5f0c"},
	} {
		if err := d.SetVMMetadata(ctx, vm.CID, tc.md); err != nil {
			t.Fatal(err)
		}
		srv, err := a.get(t, "compute", "/servers/"+vm.CID)
		if err != nil {
			t.Fatal(err)
		}
		if got := srv["server"].(map[string]any)["name"]; got != tc.want {
			t.Errorf("after set_vm_metadata %v the server is named %q, want %q", tc.md, got, tc.want)
		}
	}
}

// A delete Nova dropped half-way (under load, Neutron failing to release
// the ports leaves the server ERROR and Nova deletes it no further) is
// sent again while delete_vm waits. The dropped delete is stood in for by
// the administrator's reset of the server to ERROR.
func TestDeleteNovaDroppedIsSentAgain(t *testing.T) {
	c := devCloud(t)
	ctx := context.Background()
	d, logs, sc := driverWithStemcell(t, c, nil)
	vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "agent-dropped", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"instance_type": "runway.tiny"}),
		Tags: map[string]string{"created_by": "os-test", "director": "os-test-director"}, AgentSettings: []byte(`{"agent_id":"agent-dropped"}`)})
	if err != nil {
		t.Fatal(err)
	}
	a := newAdmin(t, c)
	sc2, err := a.d.client(ctx, "compute")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sc2.Post(ctx, sc2.ServiceURL("servers", vm.CID, "action"), map[string]any{"os-resetState": map[string]any{"state": "error"}},
		nil, &gophercloud.RequestOpts{OkCodes: []int{202}}); err != nil {
		t.Fatalf("reset-state: %v", err)
	}
	if err := d.awaitServerGone(ctx, vm.CID); err != nil {
		t.Fatalf("waiting for a server whose delete was dropped: %v", err)
	}
	if _, err := d.server(ctx, vm.CID); !errors.Is(err, driver.ErrVMNotFound) {
		t.Errorf("server after the wait: %v; want gone", err)
	}
	if !strings.Contains(logs.String(), "sending it again") {
		t.Errorf("the delete was not sent again:\n%s", logs.String())
	}
}
