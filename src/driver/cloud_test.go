package driver

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

func TestMergeTags(t *testing.T) {
	m := MergeTags(map[string]string{"a": "1", "b": "1"}, nil, map[string]string{"b": "2"})
	if len(m) != 2 || m["a"] != "1" || m["b"] != "2" {
		t.Fatal(m)
	}
}

func TestEncodeNames(t *testing.T) {
	in := map[string]string{"default": "net-1", "b": "x", "bad,name": "y", "c": "has=eq"}
	s := EncodeNames(in, 255)
	if s != "b=x,default=net-1" {
		t.Fatalf("got %q", s)
	}
	got := DecodeNames(s)
	if len(got) != 2 || got["default"] != "net-1" || got["b"] != "x" {
		t.Fatal(got)
	}
	if s := EncodeNames(map[string]string{"aaaa": "1", "b": "2"}, 5); s != "b=2" {
		t.Fatalf("over the limit: %q", s)
	}
	if len(DecodeNames("")) != 0 {
		t.Fatal("empty")
	}
}
