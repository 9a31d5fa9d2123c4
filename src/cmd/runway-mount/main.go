// Command runway-mount is a stemcell's /sbin/mount.ext4 on Runway's local
// container mode: mount(8) runs it for an ext4 mount (the stemcell's
// /etc/filesystems names ext4 for a source it cannot probe), and it asks
// the VM's supervisor to mount the VM's own persistent disk, which a user
// namespace cannot (package mountsvc). Invoked as mount(8) invokes
// helpers: mount.ext4 SOURCE DIR [-sfnv] [-N NS] [-o OPTIONS] [-t TYPE].
package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/runway-cpi/runway/src/driver/local/mountsvc"
)

// socket is the service's socket inside the VM.
const socket = "/warden-cpi-dev/" + mountsvc.SocketName

func main() {
	req, fake, err := parse(os.Args[1:])
	if err != nil {
		fail(2, err)
	}
	if fake {
		return
	}
	if err := mountsvc.Ask(socket, req); err != nil {
		fail(32, err) // mount(8)'s "mount failure"
	}
}

func fail(code int, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", filepath.Base(os.Args[0]), err)
	os.Exit(code)
}

func parse(args []string) (req mountsvc.Request, fake bool, err error) {
	var pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-o" || a == "-t" || a == "-N":
			if i+1 >= len(args) {
				return req, false, fmt.Errorf("%s needs a value", a)
			}
			if a == "-o" {
				req.Options = append(req.Options, args[i+1])
			}
			i++
		case len(a) > 1 && a[0] == '-':
			for _, f := range a[1:] {
				switch f {
				case 'f':
					fake = true
				case 's', 'n', 'v':
				default:
					return req, false, fmt.Errorf("unknown flag -%c", f)
				}
			}
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return req, false, fmt.Errorf("usage: mount.ext4 SOURCE DIR [-sfnv] [-o OPTIONS]")
	}
	dir, err := filepath.Abs(pos[1])
	if err != nil {
		return req, false, err
	}
	req.Source, req.Target = pos[0], dir
	return req, fake, nil
}
