package forge

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/runway-cpi/runway/src/retry"
)

// A refused connection is a wrong URL: one attempt, no waiting. A reset
// is a hiccup: retried. Both through real sockets.
func TestTransportErrorsAreClassifiedLikeEveryClient(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + l.Addr().String()
	l.Close()
	a := NewAPI(refused, "")
	_, err = a.Do(context.Background(), "GET", "/x", nil, nil, nil)
	if err == nil || retry.Network(err).Class != retry.Permanent || Classify(err).Class != retry.Permanent {
		t.Fatalf("refused: %v classified %v", err, Classify(err))
	}

	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			c, _, _ := w.(http.Hijacker).Hijack()
			c.(*net.TCPConn).SetLinger(0) // RST, not FIN
			c.Close()
			return
		}
		w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	var out struct{ OK bool }
	if _, err := NewAPI(srv.URL, "").Do(context.Background(), "GET", "/x", nil, nil, &out); err != nil || !out.OK || calls.Load() != 2 {
		t.Fatalf("reset: err %v, answer %v after %d calls", err, out, calls.Load())
	}
}
