package vsphere

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	// vcsim makes a VM's directory from its name unescaped: "%2f" would
	// be a subdirectory there (docs/vsphere.md, "vcsim and vCenter").
	replicaSep = " - "
	os.Exit(m.Run())
}
