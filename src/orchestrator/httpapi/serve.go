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
	srv := &http.Server{Handler: lim.closeWhenFull(h), ReadHeaderTimeout: c.ReadHeaderTimeout.Duration, ReadTimeout: c.ReadTimeout.Duration,
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
// cap is reached, Accept closes the longest idle one to make room (once
// it has been idle idleGrace), and only when every connection is busy
// with a request does it wait (as netutil.LimitListener always would).
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
		v, since := l.longestIdle()
		switch wait := idleGrace - time.Since(since); {
		case v != nil && wait <= 0:
			delete(l.idle, v)
			l.mu.Unlock()
			_ = v.Close() // frees its place, and wakes us
			l.mu.Lock()
			continue
		case v != nil:
			// Just gone idle: its client may be sending on it again
			// this instant. Closed once it has been idle a while.
			t := time.AfterFunc(wait, func() { l.mu.Lock(); l.cond.Broadcast(); l.mu.Unlock() })
			l.cond.Wait()
			t.Stop()
		default:
			l.cond.Wait() // a connection closes or goes idle
		}
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

// idleGrace is how long a connection must have been idle before the cap
// closes it for a newcomer: closing one its client is reusing at that
// moment loses the request (a POST is not retried).
const idleGrace = time.Second

func (l *connLimit) longestIdle() (*limitedConn, time.Time) {
	var best *limitedConn
	var since time.Time
	for c, t := range l.idle {
		if best == nil || t.Before(since) {
			best, since = c, t
		}
	}
	return best, since
}

// closeWhenFull answers with "Connection: close" once three quarters of
// the cap are open: a client is told not to reuse its connection, rather
// than having it closed under a request it is sending (a POST lost: a
// webhook delivery is tried once) when Accept must make room.
func (l *connLimit) closeWhenFull(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.mu.Lock()
		full := l.open*4 >= l.max*3
		l.mu.Unlock()
		if full {
			w.Header().Set("Connection", "close")
		}
		h.ServeHTTP(w, r)
	})
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
