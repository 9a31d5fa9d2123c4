package lock

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	boshlog "github.com/cloudfoundry/bosh-utils/logger"
)

// Separate Lockers open separate file descriptions, which flock treats as
// separate owners: the same exclusion two processes get.
func TestExclusionAcrossLockers(t *testing.T) {
	dir := t.TempDir()
	var mu sync.Mutex
	inside, maxInside := 0, 0
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := New(dir, 10*time.Second, nil)
			if err != nil {
				t.Error(err)
				return
			}
			for j := 0; j < 20; j++ {
				release, err := l.Lock(context.Background(), "vm-1")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				inside++
				if inside > maxInside {
					maxInside = inside
				}
				mu.Unlock()
				mu.Lock()
				inside--
				mu.Unlock()
				release()
			}
		}()
	}
	wg.Wait()
	if maxInside != 1 {
		t.Fatalf("%d holders at once", maxInside)
	}
}

func TestTimeoutAndWaitLogged(t *testing.T) {
	dir := t.TempDir()
	var buf bytes.Buffer
	holder, _ := New(dir, time.Second, nil)
	release, err := holder.Lock(context.Background(), "disk-1")
	if err != nil {
		t.Fatal(err)
	}
	waiter, _ := New(dir, 50*time.Millisecond, boshlog.NewWriterLogger(boshlog.LevelDebug, &buf))
	if _, err := waiter.Lock(context.Background(), "disk-1"); !errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v; want ErrTimeout", err)
	}
	if !strings.Contains(buf.String(), "waiting for lock disk-1") {
		t.Fatalf("wait not logged: %q", buf.String())
	}
	release()
	r2, err := waiter.Lock(context.Background(), "disk-1")
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	r2()
}

func TestInvalidNames(t *testing.T) {
	l, _ := New(t.TempDir(), time.Second, nil)
	for _, n := range []string{"", "../x", "a/b", ".hidden"} {
		if _, err := l.Lock(context.Background(), n); err == nil {
			t.Errorf("name %q accepted", n)
		}
	}
}
