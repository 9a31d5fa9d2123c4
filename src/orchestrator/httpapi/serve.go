package httpapi

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/runway-cpi/runway/src/orchestrator"
	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// Serve serves h on ln with the configured timeouts, connection cap and
// per-client share until ctx ends, then shuts down within 5 s. m (may be
// nil) counts the connections cut off.
func Serve(ctx context.Context, c config.HTTPConfig, ln net.Listener, h http.Handler, m *orchestrator.Metrics) error {
	var cut func(reason string)
	if m != nil {
		cut = m.HTTPConnectionCut
	}
	lim := newConnLimit(ln, c.MaxConnections, c.MaxConnectionsPerClient, cut)
	srv := &http.Server{Handler: lim.guard(h, c.ReadBodyTimeout.Duration), ReadHeaderTimeout: c.ReadHeaderTimeout.Duration,
		ReadTimeout: c.ReadTimeout.Duration, WriteTimeout: c.WriteTimeout.Duration, IdleTimeout: c.IdleTimeout.Duration,
		MaxHeaderBytes: 64 << 10, ConnState: lim.track, ConnContext: withConn}
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

type connKey struct{}

// withConn puts the connection a request came on into its context, for
// guard.
func withConn(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// guard is the handler under the cap: it answers with "Connection: close"
// once three quarters of the cap are open, so a client is told not to
// reuse its connection rather than having it closed under a request it
// is sending (a POST lost: a webhook delivery is tried once) when Accept
// must make room; it bounds the request's body by bodyTimeout from the
// end of its headers; and it tells the cap when the request has been
// received whole (from then on the server is answering, not waiting on
// the client).
func (l *connLimit) guard(h http.Handler, bodyTimeout time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := r.Context().Value(connKey{}).(*limitedConn)
		l.mu.Lock()
		full := len(l.conns)*4 >= l.max*3
		gen := 0
		if c != nil {
			gen = c.gen
		}
		l.mu.Unlock()
		if full {
			w.Header().Set("Connection", "close")
		}
		switch {
		case c == nil:
		case r.ContentLength == 0:
			c.received(gen)
		default:
			b := &watchedBody{ReadCloser: r.Body, done: func() { c.received(gen) }}
			if bodyTimeout > 0 {
				b.timer = time.AfterFunc(bodyTimeout, func() { l.bodyLate(c, gen) })
			}
			r.Body = b
		}
		h.ServeHTTP(w, r)
	})
}

// watchedBody is a request body that reports its end (io.EOF) once and
// stops its deadline then.
type watchedBody struct {
	io.ReadCloser
	done  func()
	timer *time.Timer
	once  sync.Once
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(func() {
			if b.timer != nil {
				b.timer.Stop()
			}
			b.done()
		})
	}
	return n, err
}
