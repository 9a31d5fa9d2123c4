package driver

import (
	"encoding/json"
	"sort"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver/catalog"
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/retry"
)

// Deps are what a driver gets besides its own config section.
type Deps struct {
	StateDir string
	Logger   logging.Logger
	Locker   *lock.Locker
	Retry    retry.Policy
	// Redact registers values that must never be logged (credentials).
	Redact func(values ...string)
	// Host is the driver's section as the config file has it, before a
	// request context's keys went over it (nil: no context): what a
	// driver holds a context's choice to (the Kubernetes namespace).
	Host json.RawMessage
}

// Factory builds a driver from its (context-merged) config section.
type Factory func(section json.RawMessage, deps Deps) (Driver, error)

// Registration is everything the CPI needs of one driver, given once by
// the driver's package (its init): its config section (its keys, the
// official keys it takes, what a request context may set; config.Section
// decodes it and merges a context over it) and how to build it.
type Registration struct {
	config.Section
	New Factory
}

var registry = map[string]Registration{}

// Register makes a driver available; an executable carries the drivers
// it imports.
func Register(r Registration) {
	if _, ok := catalog.Lookup(r.Name); !ok {
		panic("driver: " + r.Name + " is not in the driver table (src/driver/catalog)")
	}
	if _, dup := registry[r.Name]; dup {
		panic("driver: " + r.Name + " registered twice")
	}
	for _, k := range r.ContextKeys {
		if _, ok := r.Keys()[k]; !ok {
			panic("driver: " + r.Name + ": context key " + k + " is not a config key")
		}
	}
	registry[r.Name] = r
}

// Lookup returns driver name's registration.
func Lookup(name string) (Registration, bool) {
	r, ok := registry[name]
	return r, ok
}

// Names lists the registered drivers, sorted.
func Names() []string {
	out := make([]string, 0, len(registry))
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// DecodeConfig decodes driver name's section by its registration
// (config.Section.Decode).
func DecodeConfig(name string, section json.RawMessage, into any) error {
	r, ok := registry[name]
	if !ok {
		r = Registration{Section: config.Section{Name: name}}
	}
	return r.Decode(section, into)
}
