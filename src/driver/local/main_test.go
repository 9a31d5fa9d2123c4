package local_test

import (
	"os"
	"testing"

	"github.com/runway-cpi/runway/src/driver/local"
)

// TestMain: the tests run the driver in this process, so what the driver
// starts itself for (a process VM's console writer) is this test binary
// started again, as cpi-local's main does.
func TestMain(m *testing.M) {
	local.Supervised()
	os.Exit(m.Run())
}
