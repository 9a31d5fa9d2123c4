package poll

import (
	"context"
	"testing"
	"time"
)

func TestWaitForGrowsAndTimesOut(t *testing.T) {
	p := Polling{PollMaxMilli: 4, WaitTimeoutSeconds: 1}
	calls := 0
	err := p.WaitFor(context.Background(), Poll{First: time.Millisecond, Factor: 20, CheckFirst: true}, "x", nil, func(context.Context) (bool, error) {
		calls++
		return calls == 5, nil
	})
	if err != nil || calls != 5 {
		t.Fatalf("err %v after %d checks", err, calls)
	}
	start := time.Now()
	p.WaitTimeoutSeconds = 0
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err = p.WaitFor(ctx, Poll{First: time.Millisecond, Factor: 15}, "never", nil, func(context.Context) (bool, error) { return false, nil })
	if err == nil || time.Since(start) > time.Second {
		t.Fatalf("err %v after %s", err, time.Since(start))
	}
}
