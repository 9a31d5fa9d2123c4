package httpapi

import (
	"context"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// Serve serves h on ln with the configured timeouts and connection cap
// until ctx ends, then shuts down within 5 s.
func Serve(ctx context.Context, c config.HTTPConfig, ln net.Listener, h http.Handler) error {
	lim := newConnLimit(ln, c.MaxConnections)
	srv := &http.Server{Handler: h, ReadHeaderTimeout: c.ReadHeaderTimeout.Duration, ReadTimeout: c.ReadTimeout.Duration,
		WriteTimeout: c.WriteTimeout.Duration, IdleTimeout: c.IdleTimeout.Duration, MaxHeaderBytes: 64 << 10,
		ConnState: lim.track}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lim) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(shut)
}

// connLimit is the listener with the connection cap: at most max open,
// but idle keep-alive connections never keep a new client out — when the
// cap is reached, Accept closes the longest idle one to make room, and
// only when every connection is busy with a request does it wait (as
// netutil.LimitListener always would).
type connLimit struct {
	net.Listener
	mu     sync.Mutex
	cond   *sync.Cond
	max    int
	open   int
	closed bool
	idle   map[*limitedConn]time.Time // idle since
}

func newConnLimit(ln net.Listener, max int) *connLimit {
	l := &connLimit{Listener: ln, max: max, idle: map[*limitedConn]time.Time{}}
	l.cond = sync.NewCond(&l.mu)
	return l
}

func (l *connLimit) Accept() (net.Conn, error) {
	l.mu.Lock()
	for l.open >= l.max && !l.closed {
		if v := l.longestIdle(); v != nil {
			delete(l.idle, v)
			l.mu.Unlock()
			_ = v.Close() // frees its place, and wakes us
			l.mu.Lock()
			continue
		}
		l.cond.Wait() // a connection closes or goes idle
	}
	if l.closed {
		l.mu.Unlock()
		return nil, net.ErrClosed
	}
	l.open++
	l.mu.Unlock()
	c, err := l.Listener.Accept()
	if err != nil {
		l.release()
		return nil, err
	}
	return &limitedConn{Conn: c, l: l}, nil
}

func (l *connLimit) Close() error {
	l.mu.Lock()
	l.closed = true
	l.cond.Broadcast()
	l.mu.Unlock()
	return l.Listener.Close()
}

func (l *connLimit) release() {
	l.mu.Lock()
	l.open--
	l.cond.Broadcast()
	l.mu.Unlock()
}

func (l *connLimit) longestIdle() *limitedConn {
	var best *limitedConn
	var since time.Time
	for c, t := range l.idle {
		if best == nil || t.Before(since) {
			best, since = c, t
		}
	}
	return best
}

// track is the server's ConnState hook: which connections are idle.
func (l *connLimit) track(c net.Conn, s http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if s == http.StateIdle {
		l.idle[lc] = time.Now()
		l.cond.Broadcast()
		return
	}
	delete(l.idle, lc)
}

type limitedConn struct {
	net.Conn
	l    *connLimit
	once sync.Once
}

func (c *limitedConn) Close() error {
	c.once.Do(func() {
		c.l.mu.Lock()
		delete(c.l.idle, c)
		c.l.mu.Unlock()
		c.l.release()
	})
	return c.Conn.Close()
}
