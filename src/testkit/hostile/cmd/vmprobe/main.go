// Command vmprobe runs inside a VM in the hostile tests, for what a shell
// and busybox cannot do:
//
//	vmprobe addkey DESC   add a user key described DESC to the user
//	                      keyring, say KEY-ADDED, then wait for SIGTERM
//	vmprobe fill PATH     write to PATH until a write fails, then say
//	                      FILL-STOPPED <bytes written> <error>
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: vmprobe addkey DESC | fill PATH")
		os.Exit(2)
	}
	switch os.Args[1] {
	case "addkey":
		id, err := unix.AddKey("user", os.Args[2], []byte("victim's secret"), unix.KEY_SPEC_USER_KEYRING)
		if err != nil {
			fmt.Println("KEY-FAILED", err)
			os.Exit(1)
		}
		fmt.Println("KEY-ADDED", id)
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		<-c
	case "fill":
		f, err := os.OpenFile(os.Args[2], os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			fmt.Println("FILL-STOPPED 0", err)
			return
		}
		buf := make([]byte, 1<<20)
		var n int64
		for {
			w, err := f.Write(buf)
			n += int64(w)
			if err == nil {
				err = f.Sync()
			}
			if err != nil {
				fmt.Println("FILL-STOPPED", n, err)
				return
			}
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown probe", os.Args[1])
		os.Exit(2)
	}
}
