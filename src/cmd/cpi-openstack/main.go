// Command cpi-openstack is the CPI with the openstack driver; bin/cpi runs it for
// configs that select openstack (docs/architecture.md, "Executables").
package main

import (
	"os"

	"github.com/runway-cpi/runway/src/cmd/internal/cpimain"
	_ "github.com/runway-cpi/runway/src/driver/openstack"
)

func main() { os.Exit(cpimain.Main()) }
