package httpapi

import (
	"net"
	"runtime"
	"testing"
	"time"
)

// A keep-alive connection idle past idleGrace whose next request has begun
// arriving (bytes read, headers not yet parsed) is not idle: cutting it
// then lost a delivery the server had read and answered — the client saw
// EOF (CI, TestGitHubThousandJobsInsideItsRateLimit: 25 of 3,000). It
// gives its place only once it keeps the server waiting stallGrace.
func TestANextRequestArrivingIsNotIdle(t *testing.T) {
	now := time.Now()
	c := oneConn(nil) // no socket: nothing unread
	c.phase, c.since = idle, now.Add(-time.Minute)
	l := c.l

	if v, reason := l.victim(now); v != c || reason != "idle" {
		t.Fatalf("a connection idle a minute: victim %v (%q), want it (idle)", v, reason)
	}
	c.got.Store(40)
	c.began.Store(now.Add(-10 * time.Millisecond).UnixNano())
	if v, reason := l.victim(now); v != nil {
		t.Fatalf("its next request began 10 ms ago: chosen as a victim (%q)", reason)
	}
	c.began.Store(now.Add(-stallGrace).UnixNano())
	if v, reason := l.victim(now); v != c || reason != "stalled" {
		t.Fatalf("its next request began %v ago and is still not whole: victim %v (%q), want it (stalled)", stallGrace, v, reason)
	}
}

// A keep-alive connection idle past idleGrace whose client has written its
// next request, which the server's reader has not read yet (a loaded
// machine: the goroutine runnable, not running), is not idle either:
// cutting it loses a request the client has sent (CI under load,
// TestGitHubThousandJobsInsideItsRateLimit: 6 of ~3,000 deliveries EOF).
func TestARequestWaitingInTheSocketIsNotIdle(t *testing.T) {
	client, server := tcpPair(t)
	now := time.Now()
	c := oneConn(server)
	c.phase, c.since = idle, now.Add(-time.Minute)
	l := c.l
	if v, reason := l.victim(now); v != c || reason != "idle" {
		t.Fatalf("a connection idle a minute, nothing sent: victim %v (%q), want it (idle)", v, reason)
	}

	if _, err := client.Write([]byte("POST /webhooks/github HTTP/1.1\r\n")); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); !c.unread(); {
		if time.Now().After(deadline) {
			t.Fatal("the bytes written never showed as unread in the server's socket")
		}
		runtime.Gosched()
	}
	if v, reason := l.victim(now); v != nil {
		t.Fatalf("its client has written the next request, unread by the server: chosen as a victim (%q)", reason)
	}
	// Never read whole, it is cut once it has kept the server waiting.
	if v, reason := l.victim(now.Add(stallGrace)); v != c || reason != "stalled" {
		t.Fatalf("the request unread %v later: victim %v (%q), want it (stalled)", stallGrace, v, reason)
	}

	// A new connection that has sent nothing is idle; once its request
	// waits unread, it is not.
	c.phase, c.since = receiving, time.Time{}
	c.began.Store(0)
	c.waited.Store(int64(time.Minute))
	if v, reason := l.victim(now); v != nil {
		t.Fatalf("a new connection whose request waits unread: chosen as a victim (%q)", reason)
	}
}

// A new connection whose client sends its request half a second or more
// after connecting (a loaded sender: its goroutine descheduled between
// dial and write), then all of it at once, has kept the server waiting
// for nothing of a request: the wait was idleness. Counted as a stall,
// it was cut while its handler ran and the client read EOF on a fresh
// connection, which no client retries (CI beside other builds,
// TestGitHubThousandJobsInsideItsRateLimit: 2 of ~3,000 deliveries).
func TestALateFirstByteIsNotAStall(t *testing.T) {
	client, server := tcpPair(t)
	c := oneConn(server) // receiving, nothing yet
	l := c.l

	read := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 4096))
		read <- err
	}()
	// The server's reader waits for the first byte longer than the stall
	// grace, as long as the client takes to send it.
	for c.waiting(time.Now()) < stallGrace+100*time.Millisecond {
		time.Sleep(10 * time.Millisecond)
	}
	req := "POST /webhooks/github HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
	if _, err := client.Write([]byte(req)); err != nil {
		t.Fatal(err)
	}
	if err := <-read; err != nil {
		t.Fatal(err)
	}
	if v, reason := l.victim(time.Now()); v != nil {
		t.Fatalf("its request came whole, late after it connected: chosen as a victim (%q) while the server answers it", reason)
	}
}

// tcpPair is a connected pair on the loopback, closed when the test ends.
func tcpPair(t *testing.T) (client, server net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if client, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	if server, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	return client, server
}

// oneConn is server's connection, the only one under a cap of one.
func oneConn(server net.Conn) *limitedConn {
	l := &connLimit{max: 1, perClient: 1, conns: map[*limitedConn]struct{}{}, byClient: map[string]int{}}
	c := &limitedConn{Conn: server, l: l, client: "127.0.0.1"}
	l.conns[c] = struct{}{}
	l.byClient[c.client] = 1
	return c
}
