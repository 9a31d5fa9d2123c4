// Command cpi-vsphere is the CPI with the vsphere driver; bin/cpi runs it for
// configs that select vsphere (docs/architecture.md, "Executables").
package main

import (
	"os"

	"github.com/runway-cpi/runway/src/cmd/internal/cpimain"
	_ "github.com/runway-cpi/runway/src/driver/vsphere"
)

func main() { os.Exit(cpimain.Main()) }
