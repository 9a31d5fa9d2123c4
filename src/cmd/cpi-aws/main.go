// Command cpi-aws is the CPI with the aws driver; bin/cpi runs it for
// configs that select aws (docs/architecture.md, "Executables").
package main

import (
	"os"

	"github.com/runway-cpi/runway/src/cmd/internal/cpimain"
	_ "github.com/runway-cpi/runway/src/driver/aws"
)

func main() { os.Exit(cpimain.Main()) }
