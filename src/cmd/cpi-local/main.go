// Command cpi-local is the CPI with the local driver; bin/cpi runs it for
// configs that select local (docs/architecture.md, "Executables").
package main

import (
	"os"

	"github.com/runway-cpi/runway/src/cmd/internal/cpimain"
	_ "github.com/runway-cpi/runway/src/driver/local"
	"github.com/runway-cpi/runway/src/driver/local/console"
	"github.com/runway-cpi/runway/src/driver/local/container"
)

func main() {
	// A container VM's supervisor, and the end of a process VM's output
	// pipe, are this executable started again.
	container.Supervised()
	console.Served()
	os.Exit(cpimain.Main())
}
