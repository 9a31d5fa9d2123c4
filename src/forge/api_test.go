package forge

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/retry"
)

func get(t *testing.T, tr *Transport, u string) (*http.Response, error) {
	t.Helper()
	req, _ := http.NewRequestWithContext(context.Background(), "GET", u, nil)
	return tr.Client().Do(req)
}

// A refused connection is a wrong URL: one attempt, no waiting. A reset
// is a hiccup: retried. Both through real sockets.
func TestTransportErrorsAreClassifiedLikeEveryClient(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + l.Addr().String()
	l.Close()
	req, _ := http.NewRequest("GET", refused+"/x?token=abc", nil)
	_, err = NewTransport(nil).RoundTrip(req)
	if err == nil || retry.Network(err).Class != retry.Permanent || Classify(err).Class != retry.Permanent {
		t.Fatalf("refused: %v classified %v", err, Classify(err))
	}
	if strings.Contains(err.Error(), "token=abc") {
		t.Errorf("the query reached the error: %v", err)
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
	resp, err := get(t, NewTransport(nil), srv.URL+"/x")
	if err != nil || calls.Load() != 2 {
		t.Fatalf("reset: err %v after %d calls", err, calls.Load())
	}
	resp.Body.Close()
}

// Throttles and 5xx are retried (a POST's body sent again whole) with the
// header read for each request; past the budget the last answer goes back
// to the caller, as does a permanent refusal at once.
func TestTransportRetriesThenAnswers(t *testing.T) {
	var calls atomic.Int32
	var bodies, auths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies, auths = append(bodies, string(b)), append(auths, r.Header.Get("Authorization"))
		switch n := calls.Add(1); {
		case r.URL.Path == "/gone":
			w.WriteHeader(404)
			w.Write([]byte(`{"message":"Not Found"}`))
		case r.URL.Path == "/down" || n == 1:
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(429)
			w.Write([]byte(`{"message":"slow down"}`))
		default:
			w.Write([]byte(`{"ok":true}`))
		}
	}))
	defer srv.Close()
	var n atomic.Int32
	tr := NewTransport(func() string { return "token t" + string(rune('0'+n.Add(1))) })
	req, _ := http.NewRequest("POST", srv.URL+"/x", strings.NewReader(`{"a":1}`))
	resp, err := tr.Client().Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("after a 429: %v %v", resp, err)
	}
	resp.Body.Close()
	if bodies[0] != `{"a":1}` || bodies[1] != `{"a":1}` || auths[0] != "token t1" || auths[1] != "token t2" {
		t.Errorf("bodies %q, auth headers %q", bodies, auths)
	}

	calls.Store(0)
	tr.Retry.Budget = 200 * time.Millisecond
	resp, err = get(t, tr, srv.URL+"/down")
	if err != nil || resp.StatusCode != 429 || calls.Load() < 2 {
		t.Fatalf("past the budget: %v %v after %d calls", resp, err, calls.Load())
	}
	b, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(b), "slow down") {
		t.Errorf("the last answer's body was lost: %q", b)
	}
	calls.Store(0)
	resp, err = get(t, tr, srv.URL+"/gone")
	if err != nil || resp.StatusCode != 404 || calls.Load() != 1 {
		t.Fatalf("404: %v %v after %d calls", resp, err, calls.Load())
	}
	e := ResponseError(resp, "Not Found")
	if !errors.Is(e, ErrNotFound) || e.Method != "GET" || e.URL != srv.URL+"/gone" {
		t.Errorf("ResponseError %+v", e)
	}
}
