// Package mountsvc is how a container VM's root asks the host to mount
// one of the VM's own persistent disks inside it: ext4 cannot be mounted
// inside a user namespace, and a stemcell whose agent mounts its disks
// itself (agent.json without BindMountPersistentDisk) gets its mount(8)
// helper, mount.ext4, from this package's client. The server is the VM's
// supervisor; the socket is DisksDir/SocketName inside the VM.
//
// One request a connection: a JSON object (at most MaxRequest bytes, sent
// within Deadline), answered by a JSON object.
package mountsvc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// SocketName is the socket's name in the VM's disks directory.
	SocketName = "mount.sock"
	// MaxRequest bounds a request; Deadline is how long a connection may
	// take to send it (a VM keeping a connection idle holds a slot no
	// longer); Slots is how many connections are served at once.
	MaxRequest = 4 << 10
	Deadline   = 5 * time.Second
	Slots      = 4
)

// Request: mount Source (the disk's path in the agent's settings,
// /warden-cpi-dev/<disk>) at Target (a directory in the VM) with mount(8)
// options.
type Request struct {
	Source  string   `json:"source"`
	Target  string   `json:"target"`
	Options []string `json:"options,omitempty"`
}

// Reply is empty on success.
type Reply struct {
	Error string `json:"error,omitempty"`
}

// Handler mounts what a request asks for, or says why not; peer is the
// connecting process's credentials as the host sees them.
type Handler func(ctx context.Context, peer unix.Ucred, req Request) error

// Serve answers requests on l until ctx ends; mounts run one at a time.
// Who connected is checked first, at accept: a peer allow refuses is
// closed at once, before a byte is read, and never holds a slot, so no
// other user of the VM can keep its root waiting.
func Serve(ctx context.Context, l *net.UnixListener, allow func(unix.Ucred) bool, h Handler) error {
	go func() { <-ctx.Done(); l.Close() }()
	slots := make(chan struct{}, Slots)
	var one sync.Mutex
	for {
		c, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return err
		}
		peer, err := peerOf(c)
		if err != nil || !allow(*peer) {
			c.Close()
			continue
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			c.Close()
			return nil
		}
		go func() {
			defer func() { <-slots }()
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(Deadline))
			rep := Reply{}
			if err := serveOne(ctx, c, *peer, h, &one); err != nil {
				rep.Error = err.Error()
			}
			_ = c.SetWriteDeadline(time.Now().Add(Deadline)) // also past a read deadline
			_ = json.NewEncoder(c).Encode(rep)
		}()
	}
}

// peerOf is the connecting process's credentials as the host sees them.
func peerOf(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var peer *unix.Ucred
	var perr error
	if err := raw.Control(func(fd uintptr) { peer, perr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	return peer, perr
}

func serveOne(ctx context.Context, c *net.UnixConn, peer unix.Ucred, h Handler, one *sync.Mutex) error {
	var req Request
	dec := json.NewDecoder(io.LimitReader(c, MaxRequest))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return fmt.Errorf("request: not sent within %s", Deadline)
		}
		return fmt.Errorf("request: not one JSON object of at most %d bytes: %w", MaxRequest, err)
	}
	_ = c.SetDeadline(time.Now().Add(time.Minute)) // the mount may wait for a CPI call's lock
	one.Lock()
	defer one.Unlock()
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return h(hctx, peer, req)
}

// Ask sends req to the service at socket and answers its error.
func Ask(socket string, req Request) error {
	c, err := net.DialTimeout("unix", socket, Deadline)
	if err != nil {
		return fmt.Errorf("no Runway mount service answers at %s (ext4 cannot be mounted inside this container otherwise): %w", socket, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return err
	}
	var rep Reply
	if err := json.NewDecoder(io.LimitReader(c, MaxRequest)).Decode(&rep); err != nil {
		return fmt.Errorf("the mount service's answer: %w", err)
	}
	if rep.Error != "" {
		return errors.New(rep.Error)
	}
	return nil
}

// Options is what the host does with the options mount(8) passes: a
// read-only mount or not, and per-mount flags. A disk is always mounted
// nosuid and nodev; what only its file system could change (data=,
// errors=, remount) is refused by name rather than dropped.
func Options(opts []string) (attrs uint64, err error) {
	attrs = unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV
	for _, list := range opts {
		for _, o := range strings.Split(list, ",") {
			switch o {
			case "", "defaults", "rw", "async", "auto", "noauto", "nouser", "nofail", "_netdev", "nosuid", "nodev", "dev", "suid", "exec", "diratime":
				// the host's defaults; suid and dev are never given
			case "ro":
				attrs |= unix.MOUNT_ATTR_RDONLY
			case "noexec":
				attrs |= unix.MOUNT_ATTR_NOEXEC
			case "noatime":
				attrs = attrs&^unix.MOUNT_ATTR__ATIME | unix.MOUNT_ATTR_NOATIME
			case "relatime":
				attrs = attrs&^unix.MOUNT_ATTR__ATIME | unix.MOUNT_ATTR_RELATIME
			case "strictatime":
				attrs = attrs&^unix.MOUNT_ATTR__ATIME | unix.MOUNT_ATTR_STRICTATIME
			case "nodiratime":
				attrs |= unix.MOUNT_ATTR_NODIRATIME
			case "remount", "bind", "rbind", "move", "loop":
				return 0, fmt.Errorf("mount option %q: a Runway disk is mounted afresh only (unmount it and mount it again)", o)
			default:
				return 0, fmt.Errorf("mount option %q: a Runway disk takes only ro/rw and per-mount flags (noexec, noatime, relatime, strictatime, nodiratime); its file system's own options are the host's", o)
			}
		}
	}
	return attrs, nil
}
