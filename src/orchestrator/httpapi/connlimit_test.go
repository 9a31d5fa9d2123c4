package httpapi

import (
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
	l := &connLimit{max: 1, perClient: 1, conns: map[*limitedConn]struct{}{}, byClient: map[string]int{}}
	c := &limitedConn{l: l, client: "127.0.0.1", phase: idle, since: now.Add(-time.Minute)}
	l.conns[c] = struct{}{}
	l.byClient[c.client] = 1

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
