package driver

import (
	"encoding/json"
	"sort"

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
}

// Factory builds a driver from its (context-merged) config section.
type Factory func(section json.RawMessage, deps Deps) (Driver, error)

var factories = map[string]Factory{}

// Register makes a driver available under name; each driver package
// registers itself once, and an executable carries the drivers it imports.
func Register(name string, f Factory) {
	if _, dup := factories[name]; dup {
		panic("driver: " + name + " registered twice")
	}
	factories[name] = f
}

// Lookup returns the factory of driver name.
func Lookup(name string) (Factory, bool) {
	f, ok := factories[name]
	return f, ok
}

// Names lists the registered drivers, sorted.
func Names() []string {
	out := make([]string, 0, len(factories))
	for n := range factories {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
