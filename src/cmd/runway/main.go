// Command runway is the operator CLI: `runway call` sends one request to a
// CPI, `runway demo` walks a whole lifecycle through bin/cpi.
package main

import (
	"fmt"
	"os"
)

func usage() {
	fmt.Fprint(os.Stderr, `usage: runway <command> [flags]

commands:
  call <method> [json-arg ...]   send one request to bin/cpi and print the answer
  demo                           run a VM + disk + snapshot lifecycle through bin/cpi
`)
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "call":
		err = callCmd(os.Args[2:])
	case "demo":
		err = demoCmd(os.Args[2:])
	case "-h", "--help", "help":
		usage()
		return
	default:
		usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "runway:", err)
		os.Exit(1)
	}
}
