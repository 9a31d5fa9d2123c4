package vsphere

import (
	"testing"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/drivertest"
)

// The conformance suite on vcsim.
func TestConformance(t *testing.T) {
	sim := newSim(t)
	drivertest.Run(t, drivertest.Fixture{
		New:           func(t *testing.T) driver.Driver { return sim.newDriver(t, nil) },
		StemcellImage: func(t *testing.T) (string, driver.Props) { return stemcellImage(t), driver.Props{} },
		VMProps:       smallVM(nil),
		Networks:      manualNet("10.0.0.10", "VM Network"),
		UnknownVM:     "vm-00000000-0000-4000-8000-000000000000",
		UnknownDisk:   "disk-00000000-0000-4000-8000-000000000000",
	})
}
