package local_test

import (
	"os"
	"testing"

	"github.com/runway-cpi/runway/src/driver/local/console"
)

// TestMain: the tests run the driver in this process, so process VMs'
// console writer is this test binary started again (cpi-local's main
// does the same).
func TestMain(m *testing.M) {
	console.Served()
	os.Exit(m.Run())
}
