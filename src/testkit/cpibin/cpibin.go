// Package cpibin builds the CPI executables for tests that run bin/cpi as
// a subprocess: bin/cpi and the driver executables it runs, in one
// directory, once per run (Build).
package cpibin

import (
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/runway-cpi/runway/src/driver/catalog"
)

var (
	mu    sync.Mutex
	built = map[string]string{}
)

// Path builds (once per set of drivers) bin/cpi and cpi-<driver> for each
// driver named (all of them when none is) into one directory, and returns
// bin/cpi's path.
func Path(drivers ...string) (string, error) {
	if len(drivers) == 0 {
		drivers = catalog.Names()
	}
	sort.Strings(drivers)
	key := strings.Join(drivers, ",")
	mu.Lock()
	defer mu.Unlock()
	if p, ok := built[key]; ok {
		return p, nil
	}
	pkgs := []string{"github.com/runway-cpi/runway/src/cmd/cpi"}
	for _, d := range drivers {
		row, ok := catalog.Lookup(d)
		if !ok {
			return "", fmt.Errorf("no driver %q in src/driver/catalog", d)
		}
		pkgs = append(pkgs, "github.com/runway-cpi/runway/"+row.Main())
	}
	dir, err := Build(pkgs...)
	if err != nil {
		return "", fmt.Errorf("building the CPI executables: %w", err)
	}
	built[key] = filepath.Join(dir, "cpi")
	return built[key], nil
}
