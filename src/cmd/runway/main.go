// Command runway is the runner orchestrator daemon (`runway serve`), its
// operator CLI (status, runners, drain, resume) and the CPI CLI (`runway
// call` sends one request to a CPI, `runway demo` walks a lifecycle).
package main

import (
	"fmt"
	"os"

	"github.com/runway-cpi/runway/src/logging"
)

func usage() {
	fmt.Fprint(os.Stderr, `usage: runway <command> [flags]

commands:
  serve -config runway.yml       run the runner orchestrator daemon
  controller -config runway.yml  run it with its forges and groups from Kubernetes resources (in a pod)
  check -config runway.yml       ask each forge for every endpoint the groups need; name missing token scopes
  status                         groups: demand, runners, last check (from the daemon)
  runners [-all]                 runners and their state (from the daemon)
  drain <group>                  stop spawning for a group; running jobs finish
  resume <group>                 undo drain
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
	case "serve":
		err = serveCmd(os.Args[2:])
	case "controller":
		err = controllerCmd(os.Args[2:])
	case "check":
		err = checkCmd(os.Args[2:])
	case "status":
		err = statusCmd(os.Args[2:])
	case "runners":
		err = runnersCmd(os.Args[2:])
	case "drain":
		err = drainCmd(os.Args[2:], true)
	case "resume":
		err = drainCmd(os.Args[2:], false)
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
		// A forge URL's user info or query may be in any error.
		fmt.Fprintln(os.Stderr, "runway:", logging.RedactURLs(err.Error()))
		os.Exit(1)
	}
}
