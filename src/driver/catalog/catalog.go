// Package catalog is the one table of Runway's drivers: what must be known
// of each without loading it. bin/cpi answers `info` from it, the config
// reader takes its names, the build, the release, the test helpers and
// the docs enumerate drivers from it, and a driver's registration must
// name one of its rows. It depends on nothing of ours, so bin/cpi stays
// small (docs/architecture.md, "Executables" and "Adding a driver").
package catalog

import (
	"encoding/json"
	"slices"
)

// Driver is one row.
type Driver struct {
	// Name is the config's "driver" (and the official cloud.plugin), the
	// package src/driver/<Name> and the executable cpi-<Name>.
	Name string
	// StemcellFormats are what info answers.
	StemcellFormats []string
	// FormatsKey names a key of the driver's config section that replaces
	// StemcellFormats when set ("" for none).
	FormatsKey string
	// ExtraKey names a key of the driver's config section which, when set,
	// adds ExtraFormats (kubernetes.registry takes rootfs stemcells).
	ExtraKey     string
	ExtraFormats []string
	// ScriptUserData: the VM runs its user data as its process (no
	// cloud-init), so garm's runner install is rendered as a script.
	ScriptUserData bool
	// OfficialKeys are keys of the official config's cloud.properties
	// that belong to the driver's section although they are not under
	// its name (the vSphere CPI's vcenters).
	OfficialKeys []string
}

// Drivers is the table, in name order.
var Drivers = []Driver{
	{Name: "aws", StemcellFormats: []string{"aws-raw", "aws-light"}},
	{Name: "kubernetes", StemcellFormats: []string{"kubernetes-light"}, ExtraKey: "registry", ExtraFormats: []string{"warden-tar"}, ScriptUserData: true},
	{Name: "local", StemcellFormats: []string{"runway-local", "warden-tar", "general-tar"}, FormatsKey: "stemcell_formats", ScriptUserData: true},
	{Name: "openstack", StemcellFormats: []string{"openstack-qcow2", "openstack-raw", "openstack-light"}},
	{Name: "vsphere", StemcellFormats: []string{"vsphere-ovf", "vsphere-ova"}, OfficialKeys: []string{"vcenters", "plugins"}},
}

// Names lists the drivers' names.
func Names() []string {
	out := make([]string, len(Drivers))
	for i, d := range Drivers {
		out[i] = d.Name
	}
	return out
}

// Lookup finds a driver's row.
func Lookup(name string) (Driver, bool) {
	i := slices.IndexFunc(Drivers, func(d Driver) bool { return d.Name == name })
	if i < 0 {
		return Driver{}, false
	}
	return Drivers[i], true
}

// Formats is a known driver's stemcell formats (nil for another name).
func Formats(name string) []string {
	d, _ := Lookup(name)
	return d.StemcellFormats
}

// Executable is the driver's executable, beside bin/cpi.
func (d Driver) Executable() string { return "cpi-" + d.Name }

// Main is the import path of the executable's main package, relative to
// the module.
func (d Driver) Main() string { return "src/cmd/" + d.Executable() }

// Answered is what info answers for the driver with its config section:
// its formats, or the section's FormatsKey list when set, plus
// ExtraFormats when the section sets ExtraKey.
func Answered(name string, section json.RawMessage) ([]string, bool) {
	d, ok := Lookup(name)
	if !ok {
		return nil, false
	}
	var s map[string]json.RawMessage
	if d.FormatsKey != "" || d.ExtraKey != "" {
		_ = json.Unmarshal(section, &s)
	}
	if d.FormatsKey != "" {
		var f []string
		if json.Unmarshal(s[d.FormatsKey], &f) == nil && len(f) > 0 {
			return f, true
		}
	}
	if v, set := s[d.ExtraKey]; d.ExtraKey != "" && set && string(v) != "null" {
		return d.WithExtra(), true
	}
	return d.StemcellFormats, true
}

// WithExtra is the driver's formats plus its ExtraFormats.
func (d Driver) WithExtra() []string {
	return append(slices.Clone(d.StemcellFormats), d.ExtraFormats...)
}
