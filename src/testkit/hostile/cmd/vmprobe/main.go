// Command vmprobe runs inside a VM in the hostile tests, for what a shell
// and busybox cannot do:
//
//	vmprobe addkey DESC   add a user key described DESC to the user
//	                      keyring, say KEY-ADDED, then wait for SIGTERM
//	vmprobe fill PATH     write to PATH until a write fails, then say
//	                      FILL-STOPPED <bytes written> <error>
//	vmprobe flood SOCKET  hold 64 connections to the unix socket SOCKET,
//	                      opening another whenever one is closed; say
//	                      FLOOD-UP connected=N refused=M <first error>
//	                      after the first 64 tries, FLOOD-END … once
//	                      its standard input ends
//	vmprobe pipes N       grow pipes to 1 MiB each until the kernel
//	                      refuses (its per-user limit) or N are held; say
//	                      PIPES-HELD <count> <error>, then wait for SIGTERM
package main

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: vmprobe addkey DESC | fill PATH | flood SOCKET | pipes N")
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
	case "flood":
		flood(os.Args[2])
	case "pipes":
		n, _ := strconv.Atoi(os.Args[2])
		held, err := 0, error(nil)
		for held < n {
			var p [2]int
			if err = unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
				break
			}
			if _, err = unix.FcntlInt(uintptr(p[1]), unix.F_SETPIPE_SZ, 1<<20); err != nil {
				break
			}
			held++
		}
		fmt.Println("PIPES-HELD", held, err)
		c := make(chan os.Signal, 1)
		signal.Notify(c, syscall.SIGTERM)
		<-c
	default:
		fmt.Fprintln(os.Stderr, "unknown probe", os.Args[1])
		os.Exit(2)
	}
}

// flood holds connections to a unix socket: what another user of a VM
// does to keep its root from a service on it.
func flood(sock string) {
	const conns = 64
	var connected, dropped, refused atomic.Int64
	var firstErr atomic.Value
	closed := make(chan struct{}, conns)
	open := func() {
		c, err := net.Dial("unix", sock)
		if err != nil {
			refused.Add(1)
			firstErr.CompareAndSwap(nil, err.Error())
			time.Sleep(10 * time.Millisecond)
			closed <- struct{}{}
			return
		}
		connected.Add(1)
		go func() { _, _ = c.Read(make([]byte, 1)); c.Close(); dropped.Add(1); closed <- struct{}{} }()
	}
	for range conns {
		open()
	}
	fmt.Printf("FLOOD-UP connected=%d refused=%d %v\n", connected.Load(), refused.Load(), firstErr.Load())
	end := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(end) }()
	for {
		select {
		case <-closed:
			open()
		case <-end:
			fmt.Printf("FLOOD-END connected=%d dropped=%d refused=%d\n", connected.Load(), dropped.Load(), refused.Load())
			return
		}
	}
}
