// Command cpi-local is the CPI with the local driver; bin/cpi runs it for
// configs that select local (docs/architecture.md, "Executables").
package main

import (
	"os"

	"github.com/runway-cpi/runway/src/cmd/internal/cpimain"
	"github.com/runway-cpi/runway/src/driver/local"
)

func main() {
	// A container VM's supervisor, an operation inside a VM's mount
	// namespace, and the end of a process VM's output pipe are this
	// executable started again.
	local.Supervised()
	os.Exit(cpimain.Main())
}
