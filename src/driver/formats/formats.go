// Package formats names the stemcell formats each driver accepts. It
// depends on nothing of ours, so bin/cpi can answer `info` without loading
// any driver (docs/architecture.md, "Executables").
package formats

import "encoding/json"

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

// Answered is what info answers for driver with its config section: the
// driver's formats, or the local section's stemcell_formats when set.
func Answered(driver string, section json.RawMessage) ([]string, bool) {
	f, ok := Of(driver)
	if ok && driver == "local" {
		var s struct {
			StemcellFormats []string `json:"stemcell_formats"`
		}
		if json.Unmarshal(section, &s) == nil && len(s.StemcellFormats) > 0 {
			f = s.StemcellFormats
		}
	}
	return f, ok
}
