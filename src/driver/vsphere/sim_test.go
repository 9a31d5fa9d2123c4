package vsphere

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/retry"
	"github.com/runway-cpi/runway/src/testkit/vcsim"
)

// sim is the shared simulator with this package's helpers.
type sim struct {
	*vcsim.Sim
	host, user, pass, caPEM string
}

func newSim(t testing.TB) *sim {
	s := vcsim.Start(t)
	return &sim{Sim: s, host: s.Host, user: s.User, pass: s.Password, caPEM: s.CAPEM}
}

func (v *sim) section(extra map[string]any) json.RawMessage {
	b, _ := json.Marshal(v.Section(extra))
	return b
}

// newDriver is a driver on the simulator with a fast wait budget.
func (v *sim) newDriver(t testing.TB, extra map[string]any) *Driver {
	t.Helper()
	dir := t.TempDir()
	locks, err := lock.New(filepath.Join(dir, "locks"), 30*time.Second, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	p := retry.Default()
	p.Base, p.MaxSleep, p.Budget = time.Millisecond, 10*time.Millisecond, 500*time.Millisecond
	d, err := New(v.section(extra), driver.Deps{StateDir: dir, Locker: locks, Retry: p, Logger: logging.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func stemcellImage(t testing.TB) string { return vcsim.StemcellImage(t) }

// testStemcell is the test stemcell made through d.
func testStemcell(t testing.TB, d *Driver) string {
	t.Helper()
	sc, err := d.CreateStemcell(bg, driverSpec(t))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func driverSpec(t testing.TB) driver.StemcellSpec {
	return driver.StemcellSpec{ImagePath: stemcellImage(t)}
}

// smallVM is a small VM for the tests.
func smallVM(extra map[string]any) driver.Props {
	m := map[string]any{"cpu": 1, "ram": 512, "disk": 1024}
	for k, v := range extra {
		m[k] = v
	}
	return driver.PropsOf(m)
}

func manualNet(ip, pg string) driver.Networks {
	return driver.Networks{"default": {Type: "manual", IP: ip, Netmask: "255.255.255.0", Gateway: "10.0.0.1",
		CloudProperties: driver.PropsOf(map[string]any{"name": pg})}}
}

var bg = context.Background()
