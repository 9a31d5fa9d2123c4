// Command cpi-local is the CPI with the local driver; bin/cpi runs it for
// configs that select local (docs/architecture.md, "Executables").
package main

import (
	"os"

	"github.com/runway-cpi/runway/src/cmd/internal/cpimain"
	_ "github.com/runway-cpi/runway/src/driver/local"
)

func main() { os.Exit(cpimain.Main()) }
