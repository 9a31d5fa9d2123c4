package vsphere

import (
	"crypto/tls"
	"encoding/pem"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"

	boshlog "github.com/cloudfoundry/bosh-utils/logger"
	govsession "github.com/vmware/govmomi/session"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/logging"
)

// throttler stands in front of vcsim as vCenter's reverse proxy does
// when vpxd is overloaded: 503 with Retry-After for the next n SOAP calls.
type throttler struct {
	n       atomic.Int64
	refused atomic.Int64
	host    string
	caPEM   string
}

func newThrottler(t *testing.T, sim *sim) *throttler {
	th := &throttler{}
	target := *sim.Server.URL
	target.User, target.Path = nil, ""
	proxy := httputil.NewSingleHostReverseProxy(&target)
	proxy.Transport = &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}} //nolint:gosec // vcsim's own cert, in this test
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/sdk" && th.n.Add(-1) >= 0 {
			th.refused.Add(1)
			w.Header().Set("Retry-After", "0")
			http.Error(w, "Service Unavailable", http.StatusServiceUnavailable)
			return
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	th.host = strings.TrimPrefix(srv.URL, "https://")
	th.caPEM = string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}))
	return th
}

// Throttled answers are waited out within the budget, and said plainly
// when the budget runs out.
func TestThrottlingIsWaitedOut(t *testing.T) {
	sim := newSim(t)
	th := newThrottler(t, sim)
	d := sim.newDriver(t, map[string]any{"host": th.host, "connection_options": map[string]any{"ca_cert": th.caPEM}})
	th.n.Store(3)
	if ok, err := d.HasVM(bg, "vm-00000000-0000-4000-8000-000000000000"); err != nil || ok {
		t.Fatalf("has_vm through 3 throttled answers: %v, %v", ok, err)
	}
	if th.refused.Load() != 3 {
		t.Fatalf("%d answers throttled, want 3", th.refused.Load())
	}
	th.n.Store(1 << 30)
	_, err := d.ListVMs(bg, nil)
	if err == nil || !strings.Contains(err.Error(), "throttled") {
		t.Fatalf("list_vms under lasting throttling: %v; want it said plainly", err)
	}
}

// An expired session (vCenter's idle timeout, a restart) is renewed once
// and the call goes on; a cached session a later process finds expired
// is renewed the same way.
func TestExpiredSessionIsRenewed(t *testing.T) {
	sim := newSim(t)
	d := sim.newDriver(t, nil)
	if _, err := d.HasVM(bg, "vm-00000000-0000-4000-8000-000000000000"); err != nil {
		t.Fatal(err)
	}
	vc, _ := d.client(bg)
	if err := govsession.NewManager(vc.sess.raw).Logout(bg); err != nil {
		t.Fatal(err)
	}
	var log strings.Builder
	d.Log.Logger, _ = logging.New(boshlog.LevelDebug, &log)
	if _, err := d.ListVMs(bg, nil); err != nil {
		t.Fatalf("a call after the session expired: %v\n%s", err, log.String())
	}
	if !strings.Contains(log.String(), "session had expired") {
		t.Errorf("the renewal is not logged: %s", log.String())
	}
	// A later process with the same state dir reuses the cached session,
	// and renews it when vCenter dropped it.
	d2, err := New(sim.section(nil), driver.Deps{StateDir: d.stateDir, Locker: d.Locks, Retry: d.Retry})
	if err != nil {
		t.Fatal(err)
	}
	vc2, err := d2.client(bg)
	if err != nil {
		t.Fatal(err)
	}
	if err := govsession.NewManager(vc2.sess.raw).Logout(bg); err != nil {
		t.Fatal(err)
	}
	d3, _ := New(sim.section(nil), driver.Deps{StateDir: d.stateDir, Locker: d.Locks, Retry: d.Retry})
	if _, err := d3.HasVM(bg, "vm-00000000-0000-4000-8000-000000000000"); err != nil {
		t.Fatalf("a process whose cached session expired: %v", err)
	}
}

// A power-on vCenter refuses for capacity: create_vm removes the VM it
// cloned and says the Director may retry (ok_to_retry).
func TestCreateVMFailingPowerOnCleansUp(t *testing.T) {
	sim := newSim(t)
	d := sim.newDriver(t, nil)
	sc := testStemcell(t, d)
	sim.Model.Service.AddFaultRule(&simulator.FaultInjectionRule{MethodName: "PowerOnVM_Task", ObjectType: "*", ObjectName: "*",
		Probability: 1, Enabled: true, MaxCount: 1, FaultType: simulator.FaultTypeCustom,
		Fault: &types.InsufficientResourcesFault{}})
	_, err := d.CreateVM(bg, driver.VMSpec{Name: "vm-11111111-1111-4111-8111-111111111111", StemcellCID: sc, CloudProps: smallVM(nil),
		Networks: manualNet("10.0.2.1", "VM Network")})
	var ce *driver.CreationError
	if !errors.As(err, &ce) || !ce.Retryable {
		t.Fatalf("create_vm with a refused power-on: %v; want a retryable creation error", err)
	}
	if ok, _ := d.HasVM(bg, "vm-11111111-1111-4111-8111-111111111111"); ok {
		t.Fatal("the failed VM was left behind")
	}
}

// A clone task that fails (a VM of that name exists: vCenter's task ends
// in DuplicateName) is a creation failure that touches the other VM not.
func TestCreateVMWhoseCloneTaskFails(t *testing.T) {
	sim := newSim(t)
	d := sim.newDriver(t, nil)
	sc := testStemcell(t, d)
	spec := driver.VMSpec{Name: "vm-22222222-2222-4222-8222-222222222222", StemcellCID: sc, CloudProps: smallVM(nil), Networks: manualNet("10.0.2.2", "VM Network")}
	if _, err := d.CreateVM(bg, spec); err != nil {
		t.Fatal(err)
	}
	spec.Networks = manualNet("10.0.2.3", "VM Network")
	_, err := d.CreateVM(bg, spec)
	var ce *driver.CreationError
	if !errors.As(err, &ce) || ce.Retryable || !strings.Contains(err.Error(), "clone") {
		t.Fatalf("a clone task that fails: %v; want a creation error, not retryable", err)
	}
	if ok, _ := d.HasVM(bg, spec.Name); !ok {
		t.Fatal("the failed create removed a VM it did not make")
	}
}

// A wrong password is named as such, and the password never shows.
func TestWrongPassword(t *testing.T) {
	sim := newSim(t)
	d := sim.newDriver(t, map[string]any{"password": "wrong-pw-0472"})
	_, err := d.HasVM(bg, "vm-00000000-0000-4000-8000-000000000000")
	if err == nil || !strings.Contains(err.Error(), `refused user "bosh@vsphere.local"'s login`) || strings.Contains(err.Error(), "wrong-pw-0472") {
		t.Fatalf("wrong password: %v", err)
	}
}
