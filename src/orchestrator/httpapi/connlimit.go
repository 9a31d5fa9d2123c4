package httpapi

import (
	"cmp"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// connLimit is the listener with the connection cap, and what bounds how
// long one client can hold a place in it.
//
// At most max connections are served at once. At the cap, the next one
// is accepted and held until a place frees; it gets the place of a
// connection that keeps the server waiting — one idle for idleGrace (its
// client may be about to use it: closing it under a request it sends
// loses a POST; a new connection that has sent nothing yet counts as
// idle), or one whose request has begun but not been received whole and
// on which the server has waited stallGrace in all — taken from the
// client holding the most connections, idle before stalled, the longest
// first.
// Only when no connection keeps the server waiting does the newcomer
// wait (as netutil.LimitListener always would).
//
// Beyond perClient connections of one client (an IPv4 address, or an
// IPv6 /64), its connections that have kept the server waiting
// stallGrace are closed even below the cap, so one client cannot keep
// every place. A client that sends its requests at once never keeps the
// server waiting, and is never cut off: a forge's burst loses nothing.
type connLimit struct {
	net.Listener
	max, perClient int
	cutOff         func(reason string) // counts connections cut off (nil: not counted)

	mu       sync.Mutex
	cond     *sync.Cond // signalled whenever a connection opens, closes or changes phase
	closed   bool
	done     chan struct{} // closed with the listener: the watcher ends
	conns    map[*limitedConn]struct{}
	byClient map[string]int
	holding  bool // Accept holds a newcomer until a place frees
}

const (
	// idleGrace is how long a connection must have been idle before the
	// cap closes it for a newcomer: closing one its client is reusing at
	// that moment loses the request (a POST is not retried).
	idleGrace = time.Second
	// stallGrace is how long, in all, the server must have waited on a
	// client for the rest of a request before that connection can be cut
	// off. A client that writes its request at once — any forge — keeps
	// it waiting for microseconds; one trickling its request, for ever.
	stallGrace = 500 * time.Millisecond
	// watchTick paces the checks while a newcomer is held or a client
	// holds more than its share.
	watchTick = 50 * time.Millisecond
)

func newConnLimit(ln net.Listener, max, perClient int, cutOff func(string)) *connLimit {
	if perClient <= 0 || perClient > max {
		perClient = max
	}
	l := &connLimit{Listener: ln, max: max, perClient: perClient, cutOff: cutOff, done: make(chan struct{}),
		conns: map[*limitedConn]struct{}{}, byClient: map[string]int{}}
	l.cond = sync.NewCond(&l.mu)
	go l.watch()
	return l
}

// phase is where a connection is in its request cycle.
type phase int

const (
	receiving phase = iota // new, or a request begun and not yet received whole
	answering              // the request received whole: the server is answering it
	idle                   // between requests (or receiving the next one's headers)
)

// Accept takes the next connection and holds it until it has a place.
func (l *connLimit) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &limitedConn{Conn: nc, l: l, client: clientOf(nc.RemoteAddr())}
	l.mu.Lock()
	for len(l.conns) >= l.max && !l.closed {
		if !l.holding {
			l.holding = true
			l.cond.Broadcast() // the watcher: a newcomer is held
		}
		if v, reason := l.victim(time.Now()); v != nil {
			l.mu.Unlock()
			v.cut(reason) // frees its place (or finds it busy again)
			l.mu.Lock()
			continue
		}
		l.cond.Wait() // a place frees, a connection changes phase, or the watcher ticks
	}
	l.holding = false
	if l.closed {
		l.mu.Unlock()
		nc.Close()
		return nil, net.ErrClosed
	}
	l.conns[c] = struct{}{}
	l.byClient[c.client]++
	l.cond.Broadcast() // the watcher: the client may be beyond its share now
	l.mu.Unlock()
	return c, nil
}

func (l *connLimit) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.done)
	}
	l.cond.Broadcast()
	l.mu.Unlock()
	return l.Listener.Close()
}

// victim is the connection whose place a held newcomer takes (nil: none
// keeps the server waiting long enough yet). Under l.mu.
func (l *connLimit) victim(now time.Time) (*limitedConn, string) {
	var best *limitedConn
	var bestReason string
	var bestRank [3]int64
	for c := range l.conns {
		reason, waited := c.slack(now)
		if reason == "" {
			continue
		}
		kind := int64(0)
		if reason == "idle" {
			kind = 1
		}
		rank := [3]int64{int64(l.byClient[c.client]), kind, int64(waited)}
		if best == nil || slices.Compare(rank[:], bestRank[:]) > 0 {
			best, bestReason, bestRank = c, reason, rank
		}
	}
	return best, bestReason
}

// beyondShare lists, for each client holding more than its share, its
// connections beyond the share that keep the server waiting for a
// request (stalled, or connected and silent: not idle between requests),
// the longest waiting first. Under l.mu.
func (l *connLimit) beyondShare(now time.Time) []*limitedConn {
	stalled := map[string][]*limitedConn{}
	for c := range l.conns {
		if l.byClient[c.client] > l.perClient && c.phase == receiving {
			if reason, _ := c.slack(now); reason != "" {
				stalled[c.client] = append(stalled[c.client], c)
			}
		}
	}
	var out []*limitedConn
	for client, cs := range stalled {
		slices.SortFunc(cs, func(a, b *limitedConn) int { return cmp.Compare(b.waiting(now), a.waiting(now)) })
		out = append(out, cs[:min(len(cs), l.byClient[client]-l.perClient)]...)
	}
	return out
}

// overShare reports whether a client holds more than its share. Under
// l.mu.
func (l *connLimit) overShare() bool {
	for _, n := range l.byClient {
		if n > l.perClient {
			return true
		}
	}
	return false
}

// watch runs while a newcomer is held or a client holds more than its
// share: every tick it cuts off stalled connections beyond their
// client's share and wakes Accept to look for a victim again (waiting
// grows with time alone, so nothing else would).
func (l *connLimit) watch() {
	tick := time.NewTicker(watchTick)
	defer tick.Stop()
	for {
		l.mu.Lock()
		for !l.closed && !l.holding && !l.overShare() {
			l.cond.Wait()
		}
		l.mu.Unlock()
		select {
		case <-l.done:
			return
		case <-tick.C:
		}
		l.mu.Lock()
		cut := l.beyondShare(time.Now())
		l.cond.Broadcast()
		l.mu.Unlock()
		for _, c := range cut {
			c.cut("client_limit")
		}
	}
}

// track is the server's ConnState hook: the phase of each connection.
func (l *connLimit) track(nc net.Conn, s http.ConnState) {
	c, ok := nc.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	switch s {
	case http.StateActive: // a request's headers are in
		if c.phase == idle {
			c.restart() // the wait for it to begin was idleness
			c.got.Store(1)
		}
		c.phase = receiving
		c.gen++
	case http.StateIdle:
		c.phase, c.since = idle, time.Now()
		c.restart()
	default:
		return
	}
	l.cond.Broadcast()
}

// bodyLate ends the body read of request gen on c at its deadline, unless
// it was received meanwhile: the handler's read fails (answered 408) and
// the server closes the connection.
func (l *connLimit) bodyLate(c *limitedConn, gen int) {
	l.mu.Lock()
	late := c.gen == gen && c.phase == receiving
	l.mu.Unlock()
	if late {
		c.Conn.SetReadDeadline(time.Now())
		if l.cutOff != nil {
			l.cutOff("body_timeout")
		}
	}
}

// clientOf is who a connection counts against: its IPv4 address, or its
// IPv6 address's /64 (what one host is usually given).
func clientOf(a net.Addr) string {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	if ip := ta.IP.To4(); ip != nil {
		return ip.String()
	}
	return ta.IP.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// limitedConn is a connection with a place under the cap.
type limitedConn struct {
	net.Conn
	l      *connLimit
	client string
	once   sync.Once

	// Under l.mu:
	phase phase
	since time.Time // idle since
	gen   int       // requests begun on it

	// How long the server has waited on the client for the request being
	// received: the reads finished (ns) and the one under way (its start,
	// in ns since the epoch; 0: none); and how many bytes came.
	waited    atomic.Int64
	readSince atomic.Int64
	got       atomic.Int64
	// When the first bytes since restart came (ns since the epoch): on an
	// idle connection, the next request has begun though the server has
	// not yet parsed its headers.
	began atomic.Int64
}

func (c *limitedConn) Read(p []byte) (int, error) {
	start := time.Now()
	c.readSince.Store(start.UnixNano())
	n, err := c.Conn.Read(p)
	if n > 0 && c.got.Add(int64(n)) == int64(n) {
		// The first bytes: the wait before them was idleness (the
		// idle rule's), not a request kept unfinished.
		c.waited.Store(0)
		c.readSince.Store(0)
		c.began.Store(time.Now().UnixNano())
		return n, err
	}
	c.readSince.Store(0)
	c.waited.Add(int64(time.Since(start)))
	return n, err
}

// restart begins counting for the next request (at StateActive, whose
// headers are in already: got is then set to 1).
func (c *limitedConn) restart() {
	c.waited.Store(0)
	c.got.Store(0)
	c.began.Store(0)
}

// waiting is how long the server has waited on the client, in all, for
// the request being received.
func (c *limitedConn) waiting(now time.Time) time.Duration {
	w := c.waited.Load()
	if s := c.readSince.Load(); s != 0 {
		w += now.UnixNano() - s
	}
	return time.Duration(w)
}

// slack says whether c may give its place to a newcomer ("idle",
// "stalled" or "": not), and how long it has kept the server waiting.
// Under l.mu.
func (c *limitedConn) slack(now time.Time) (string, time.Duration) {
	switch c.phase {
	case idle:
		if b := c.began.Load(); b != 0 {
			// Its next request is arriving: closing it now would
			// lose a request the server may already have read
			// (answered by the handler, then EOF at the client).
			if d := time.Duration(now.UnixNano() - b); d >= stallGrace {
				return "stalled", d
			}
			return "", 0
		}
		if d := now.Sub(c.since); d >= idleGrace {
			if c.unread() {
				// The client has sent its next request and the
				// server's reader has not run yet (a loaded
				// machine): as good as begun.
				c.began.CompareAndSwap(0, now.UnixNano())
				return "", 0
			}
			return "idle", d
		}
	case receiving:
		switch d := c.waiting(now); {
		case c.got.Load() == 0 && d >= idleGrace && !c.unread(): // connected, and nothing sent
			return "idle", d
		case c.got.Load() > 0 && d >= stallGrace:
			return "stalled", d
		}
	}
	return "", 0
}

// unread reports whether bytes the client sent wait in the socket, not
// yet read by the server: cutting the connection then loses a request
// the client has already written.
func (c *limitedConn) unread() bool {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	_ = rc.Control(func(fd uintptr) { n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	return n > 0
}

// received marks request gen as received whole: from now on the server
// is answering it.
func (c *limitedConn) received(gen int) {
	c.l.mu.Lock()
	if c.gen == gen && c.phase == receiving {
		c.phase = answering
	}
	c.l.mu.Unlock()
}

func (c *limitedConn) Close() error { return c.close("") }

// cut closes c on its client, counted under reason — an idle one only
// if its client has not begun a request since it was chosen (the window
// left is the one between this look and the close, microseconds).
func (c *limitedConn) cut(reason string) {
	if reason == "idle" && c.unread() {
		c.began.CompareAndSwap(0, time.Now().UnixNano()) // Accept looks again
		return
	}
	c.close(reason)
}

func (c *limitedConn) close(reason string) error {
	c.once.Do(func() {
		l := c.l
		l.mu.Lock()
		delete(l.conns, c)
		if l.byClient[c.client]--; l.byClient[c.client] <= 0 {
			delete(l.byClient, c.client)
		}
		l.cond.Broadcast()
		l.mu.Unlock()
		if reason != "" && l.cutOff != nil {
			l.cutOff(reason)
		}
	})
	return c.Conn.Close()
}
