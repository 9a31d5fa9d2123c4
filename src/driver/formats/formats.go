// Package formats names the stemcell formats each driver accepts. It
// depends on nothing, so bin/cpi can answer `info` without loading any
// driver (docs/architecture.md, "Executables").
package formats

// Stemcell formats by driver; the local driver's can be configured.
var (
	Local     = []string{"runway-local", "warden-tar", "general-tar"}
	OpenStack = []string{"openstack-qcow2", "openstack-raw", "openstack-light"}
	AWS       = []string{"aws-raw", "aws-light"}
)

// Drivers are the drivers Runway has, each in its own executable.
var Drivers = []string{"aws", "local", "openstack"}

// Of returns a driver's formats.
func Of(driver string) ([]string, bool) {
	switch driver {
	case "local":
		return Local, true
	case "openstack":
		return OpenStack, true
	case "aws":
		return AWS, true
	}
	return nil, false
}
