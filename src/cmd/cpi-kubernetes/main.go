// Command cpi-kubernetes is the CPI with the kubernetes driver; bin/cpi runs it for
// configs that select kubernetes (docs/architecture.md, "Executables").
package main

import (
	"os"

	"github.com/runway-cpi/runway/src/cmd/internal/cpimain"
	_ "github.com/runway-cpi/runway/src/driver/kubernetes"
)

func main() { os.Exit(cpimain.Main()) }
