package retry

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

var (
	errThrottle  = errors.New("429 too many requests")
	errTransient = errors.New("503")
	errFatal     = errors.New("400 bad request")
)

func classify(retryAfter time.Duration) Classifier {
	return func(err error) Verdict {
		switch err {
		case errThrottle:
			return Verdict{Class: Throttle, RetryAfter: retryAfter}
		case errTransient:
			return Verdict{Class: Transient}
		}
		return Verdict{Class: Permanent}
	}
}

// recorder replaces real sleeping: the test checks the waits chosen.
type recorder struct{ waits []time.Duration }

func (r *recorder) sleep(_ context.Context, d time.Duration) error {
	r.waits = append(r.waits, d)
	return nil
}

func policy(r *recorder, c Classifier, logs *[]string) Policy {
	return Policy{Base: 100 * time.Millisecond, MaxSleep: time.Second, Budget: 10 * time.Second, Classify: c,
		Sleep: r.sleep, Rand: func() float64 { return 0.999999 },
		Log: func(msg string, kv ...any) { *logs = append(*logs, msg) }}
}

func TestBackoffGrowsToTheCap(t *testing.T) {
	r := &recorder{}
	var logs []string
	calls := 0
	err := policy(r, classify(0), &logs).Do(context.Background(), "op", func(context.Context) error {
		calls++
		if calls < 7 {
			return errTransient
		}
		return nil
	})
	if err != nil || calls != 7 {
		t.Fatalf("err=%v calls=%d", err, calls)
	}
	want := []time.Duration{100, 200, 400, 800, 1000, 1000}
	for i, w := range want {
		if got := r.waits[i].Round(time.Millisecond); got != w*time.Millisecond {
			t.Errorf("wait %d = %s; want %dms", i, got, w)
		}
	}
	if len(logs) != 6 {
		t.Errorf("%d waits logged; want 6", len(logs))
	}
}

func TestFullJitter(t *testing.T) {
	r := &recorder{}
	var logs []string
	p := policy(r, classify(0), &logs)
	p.Rand = func() float64 { return 0.25 }
	calls := 0
	p.Do(context.Background(), "op", func(context.Context) error {
		calls++
		if calls < 3 {
			return errTransient
		}
		return nil
	})
	if r.waits[0] != 25*time.Millisecond || r.waits[1] != 50*time.Millisecond {
		t.Fatalf("waits %v; want 25ms, 50ms", r.waits)
	}
}

func TestRetryAfterIsHonouredBeyondTheCap(t *testing.T) {
	r := &recorder{}
	var logs []string
	calls := 0
	err := policy(r, classify(5*time.Second), &logs).Do(context.Background(), "op", func(context.Context) error {
		calls++
		if calls == 1 {
			return errThrottle
		}
		return nil
	})
	if err != nil || len(r.waits) != 1 || r.waits[0] < 5*time.Second || r.waits[0] > 5*time.Second+100*time.Millisecond {
		t.Fatalf("err=%v waits=%v; want one wait of 5s plus jitter", err, r.waits)
	}
}

func TestBudgetExhausted(t *testing.T) {
	r := &recorder{}
	var logs []string
	err := policy(r, classify(4*time.Second), &logs).Do(context.Background(), "create_vm", func(context.Context) error { return errThrottle })
	var be *BudgetError
	if !errors.As(err, &be) || !errors.Is(err, ErrBudgetExhausted) || !errors.Is(err, errThrottle) {
		t.Fatalf("err = %v; want BudgetError wrapping the throttle", err)
	}
	var total time.Duration
	for _, w := range r.waits {
		total += w
	}
	if total > 10*time.Second {
		t.Fatalf("waited %s, more than the budget", total)
	}
	if !strings.Contains(err.Error(), "create_vm: gave up after") {
		t.Fatalf("message %q", err)
	}
}

func TestPermanentErrorsAreNotRetried(t *testing.T) {
	r := &recorder{}
	var logs []string
	calls := 0
	err := policy(r, classify(0), &logs).Do(context.Background(), "op", func(context.Context) error { calls++; return errFatal })
	if err != errFatal || calls != 1 || len(r.waits) != 0 {
		t.Fatalf("err=%v calls=%d waits=%v", err, calls, r.waits)
	}
}

func TestCancelledWhileWaiting(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	p := Policy{Base: time.Hour, MaxSleep: time.Hour, Budget: 2 * time.Hour, Classify: classify(0), Rand: func() float64 { return 1 }}
	go cancel()
	err := p.Do(ctx, "op", func(context.Context) error { return errTransient })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v; want context.Canceled", err)
	}
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Duration{
		"": 0, "7": 7 * time.Second, "-3": 0, "soon": 0, "1.5": 0,
		now.Add(30 * time.Second).Format(time.RFC1123): 30 * time.Second,
	} {
		if got := ParseRetryAfter(in, now); got != want {
			t.Errorf("ParseRetryAfter(%q) = %s; want %s", in, got, want)
		}
	}
}

func TestPolicyFor(t *testing.T) {
	var logged bool
	c := func(error) Verdict { return Verdict{Class: Transient} }
	p := Policy{}.For(c, func(string, ...any) { logged = true })
	if p.Budget != Default().Budget || p.Classify == nil || p.Log == nil {
		t.Fatalf("For on a zero policy = %+v; want Default with the classifier and logger", p)
	}
	p.Log("x")
	if !logged {
		t.Error("the driver's logger was not used")
	}
	own := Policy{Budget: time.Second, Log: func(string, ...any) {}}.For(c, func(string, ...any) { t.Error("replaced the policy's own logger") })
	if own.Budget != time.Second {
		t.Errorf("For replaced a configured budget: %s", own.Budget)
	}
	own.Log("x")
}

// A request timeout from a real http.Client (which wraps
// context.DeadlineExceeded) is transient: the request's outcome is
// unknown, and the caller resolves it (a lookup, a resend). A refused
// endpoint is permanent.
func TestNetworkVerdicts(t *testing.T) {
	release := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer hang.Close()
	defer close(release)
	_, err := (&http.Client{Timeout: 50 * time.Millisecond}).Post(hang.URL, "application/json", strings.NewReader("{}"))
	if err == nil || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("expected a client timeout, got %v", err)
	}
	if v := Network(err); v.Class != Transient {
		t.Errorf("client timeout %q: %v, want transient", err, v.Class)
	}
	closed := httptest.NewServer(http.NotFoundHandler())
	url := closed.URL
	closed.Close()
	_, err = http.Get(url)
	if v := Network(err); v.Class != Permanent {
		t.Errorf("refused %q: %v, want permanent", err, v.Class)
	}
	// A reset the transport saw first: its read ends in net.ErrClosed.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if _, err = c.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("read on a closed conn: %v", err)
	}
	if v := Network(err); v.Class != Transient {
		t.Errorf("closed under a read %q: %v, want transient", err, v.Class)
	}
}

// MaxFaults bounds transient faults; throttles go on until the budget.
func TestMaxFaultsBoundsFaultsNotThrottles(t *testing.T) {
	for _, tc := range []struct {
		class Class
		want  int
	}{{Transient, 3}, {Throttle, 10}} {
		p := Policy{Base: time.Millisecond, MaxSleep: time.Millisecond, Budget: time.Hour, MaxFaults: 3,
			Classify: func(error) Verdict { return Verdict{Class: tc.class} },
			Sleep:    func(context.Context, time.Duration) error { return nil }}
		calls := 0
		p.Do(context.Background(), "op", func(context.Context) error {
			calls++
			if calls == 10 {
				return nil
			}
			return errors.New("fault")
		})
		if calls != tc.want {
			t.Errorf("%v: %d calls, want %d", tc.class, calls, tc.want)
		}
	}
}
