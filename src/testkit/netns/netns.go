// Package netns runs test code inside a named network namespace
// (/run/netns/<name>, as `ip netns add` makes it): a socket keeps the
// namespace it was made in, so a listener or connection opened in Do
// lives there after Do returns.
package netns

import (
	"fmt"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// Do runs f on a thread inside namespace name and moves the thread back.
func Do(name string, f func()) error { return DoPath("/run/netns/"+name, f) }

// DoPath runs f on a thread inside the network namespace whose file is
// path (/proc/<pid>/ns/net: a process's, a container VM's init's).
func DoPath(path string, f func()) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	self, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return err
	}
	defer self.Close()
	target, err := os.Open(path)
	if err != nil {
		return err
	}
	defer target.Close()
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("entering network namespace %s: %w", path, err)
	}
	f()
	if err := unix.Setns(int(self.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread stays locked, so the runtime retires it with its
		// goroutine rather than reuse it in the wrong namespace.
		runtime.LockOSThread()
		return fmt.Errorf("leaving network namespace %s: %w", path, err)
	}
	return nil
}
