package mountsvc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func serve(t *testing.T, h Handler) string {
	t.Helper()
	return serveFor(t, func(unix.Ucred) bool { return true }, h)
}

// serveFor is serve with the peers allow admits.
func serveFor(t *testing.T, allow func(unix.Ucred) bool, h Handler) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), SocketName)
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = Serve(ctx, l, allow, h) }()
	t.Cleanup(func() { cancel(); <-done })
	return sock
}

// raw sends b on a connection of its own and answers the reply.
func raw(t *testing.T, sock string, b []byte) Reply {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, _ = c.Write(b)
	var rep Reply
	if err := json.NewDecoder(c).Decode(&rep); err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestAskReachesTheHandlerWithThePeer(t *testing.T) {
	var got Request
	var who unix.Ucred
	sock := serve(t, func(_ context.Context, peer unix.Ucred, req Request) error {
		got, who = req, peer
		if req.Target == "/refused" {
			return os.ErrPermission
		}
		return nil
	})
	want := Request{Source: "/warden-cpi-dev/disk-1", Target: "/var/vcap/store", Options: []string{"rw"}}
	if err := Ask(sock, want); err != nil {
		t.Fatal(err)
	}
	if got.Source != want.Source || got.Target != want.Target || len(got.Options) != 1 {
		t.Errorf("the handler got %+v", got)
	}
	if int(who.Pid) != os.Getpid() || int(who.Uid) != os.Getuid() {
		t.Errorf("peer %+v, not this process", who)
	}
	if err := Ask(sock, Request{Source: "x", Target: "/refused"}); err == nil || !strings.Contains(err.Error(), "permission denied") {
		t.Errorf("a refusal came back as %v", err)
	}
}

// The VM as the client: what it sends never reaches the handler unless
// it is one request of the documented shape.
func TestHostileRequestsNeverReachTheHandler(t *testing.T) {
	calls := 0
	sock := serve(t, func(context.Context, unix.Ucred, Request) error { calls++; return nil })
	for name, b := range map[string][]byte{
		"too big":       []byte(`{"source":"` + strings.Repeat("a", MaxRequest) + `"}`),
		"unknown field": []byte(`{"source":"s","target":"/t","userns":"/proc/1/ns/user"}`),
		"not json":      []byte("mount /dev/sda /\n"),
		"wrong types":   []byte(`{"source":1}`),
	} {
		if rep := raw(t, sock, b); !strings.Contains(rep.Error, "request: not one JSON object") {
			t.Errorf("%s: answered %q", name, rep.Error)
		}
	}
	if calls != 0 {
		t.Errorf("the handler ran %d times", calls)
	}
}

// Connections that send nothing hold every slot until their deadline;
// the request after them is then served, and each idle one is told why
// it was dropped.
func TestIdleClientsGiveWayAtTheirDeadline(t *testing.T) {
	sock := serve(t, func(context.Context, unix.Ucred, Request) error { return nil })
	idle := make([]net.Conn, Slots)
	for i := range idle {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		idle[i] = c
	}
	if err := Ask(sock, Request{Source: "s", Target: "/t"}); err != nil {
		t.Fatal(err)
	}
	for i, c := range idle {
		var rep Reply
		if err := json.NewDecoder(c).Decode(&rep); err != nil || !strings.Contains(rep.Error, "not sent within") {
			t.Errorf("idle connection %d: %v %q", i, err, rep.Error)
		}
	}
}

func TestOptionsKeepNosuidAndNodevAndRefuseFileSystemOptions(t *testing.T) {
	base := uint64(unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV)
	for opts, want := range map[string]uint64{
		"rw":                     base,
		"defaults":               base,
		"ro":                     base | unix.MOUNT_ATTR_RDONLY,
		"suid,dev,exec":          base,
		"noexec,noatime":         base | unix.MOUNT_ATTR_NOEXEC | unix.MOUNT_ATTR_NOATIME,
		"noatime,relatime":       base | unix.MOUNT_ATTR_RELATIME,
		"strictatime,nodiratime": base | unix.MOUNT_ATTR_STRICTATIME | unix.MOUNT_ATTR_NODIRATIME,
	} {
		got, err := Options([]string{opts})
		if err != nil || got != want {
			t.Errorf("%s: %#x %v, want %#x", opts, got, err, want)
		}
	}
	for _, bad := range []string{"remount", "bind", "data=journal", "errors=continue", "rw,loop", "uid=0"} {
		if _, err := Options([]string{bad}); err == nil || !strings.Contains(err.Error(), "mount option") {
			t.Errorf("%s: accepted (%v)", bad, err)
		}
	}
}

// floodEnv makes the test binary the flooder: another process (another
// user of the VM) holding as many connections as it can, opening a new
// one whenever one is closed.
const floodEnv = "MOUNTSVC_TEST_FLOOD"

func TestMain(m *testing.M) {
	if sock := os.Getenv(floodEnv); sock != "" {
		flood(sock)
		return
	}
	os.Exit(m.Run())
}

func flood(sock string) {
	const conns = 64
	closed := make(chan struct{}, conns)
	open := func() {
		c, err := net.Dial("unix", sock)
		if err != nil {
			closed <- struct{}{}
			return
		}
		go func() { _, _ = c.Read(make([]byte, 1)); c.Close(); closed <- struct{}{} }()
	}
	for range conns {
		open()
	}
	fmt.Println("FLOOD-UP")
	for range closed {
		open()
	}
}

// Another user of the VM holding connections costs its root nothing:
// before the peer was checked at accept, such connections held every
// slot, and root waited for their deadlines (58.6 s was measured).
func TestAFloodOfOtherPeersNeverDelaysTheAllowedOne(t *testing.T) {
	me := int32(os.Getpid())
	read := 0
	sock := serveFor(t, func(p unix.Ucred) bool { return p.Pid == me }, func(context.Context, unix.Ucred, Request) error { read++; return nil })
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), floodEnv+"="+sock)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "FLOOD-UP\n" {
		t.Fatalf("the flooder: %q %v", line, err)
	}
	start := time.Now()
	if err := Ask(sock, Request{Source: "s", Target: "/t"}); err != nil {
		t.Fatal(err)
	}
	// Served before any flooder's connection could have reached its
	// deadline: none of them held a slot.
	if took := time.Since(start); took >= Deadline {
		t.Errorf("the allowed peer waited %s under the flood", took)
	}
	if read != 1 {
		t.Errorf("the handler ran %d times, want once (the flood's never)", read)
	}
}
