package lock

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	boshlog "github.com/cloudfoundry/bosh-utils/logger"
	"github.com/gofrs/flock"
)

// Separate Lockers open separate file descriptions, which flock treats as
// separate owners: the same exclusion two processes get.
func TestExclusionAcrossLockers(t *testing.T) {
	if n := maxHolders(t, t.TempDir(), 20, 0, func(*Locker) {}); n != 1 {
		t.Fatalf("%d holders at once", n)
	}
}

// maxHolders runs 8 Lockers on dir, each taking "vm-1" rounds times,
// holding it for hold, then counting itself out and calling done before
// releasing; it answers the most holders seen at once.
func maxHolders(t *testing.T, dir string, rounds int, hold time.Duration, done func(*Locker)) int {
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
			for j := 0; j < rounds; j++ {
				release, err := l.Lock(context.Background(), "vm-1")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				inside++
				maxInside = max(maxInside, inside)
				mu.Unlock()
				time.Sleep(hold)
				mu.Lock()
				inside--
				mu.Unlock()
				done(l)
				release()
			}
		}()
	}
	wg.Wait()
	return maxInside
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
	if !strings.Contains(buf.String(), "waiting for lock lock=disk-1") {
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

// Holders prune the file while others wait on it: exclusion still holds
// (waiters move to the new file) and no file is left at the end.
func TestPruneKeepsExclusion(t *testing.T) {
	dir := t.TempDir()
	// Held a while, so others queue on this file; pruned once the holder
	// is done, just before it releases (as Release does).
	n := maxHolders(t, dir, 50, 100*time.Microsecond, func(l *Locker) { l.Prune("vm-1") })
	if n != 1 {
		t.Fatalf("%d holders at once", n)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("lock files left: %v", left)
	}
}

func TestForgetRemovesOnlyExistingFiles(t *testing.T) {
	dir := t.TempDir()
	l, _ := New(dir, time.Second, nil)
	if err := l.Forget(context.Background(), "vm-never"); err != nil {
		t.Fatal(err)
	}
	release, _ := l.Lock(context.Background(), "vm-2")
	release()
	if err := l.Forget(context.Background(), "vm-2"); err != nil {
		t.Fatal(err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Fatalf("lock files left: %v", left)
	}
}

// A waiter that opened the file just before the holder pruned it ends up
// locking a file nobody else opens: Lock must see that and try again. The
// window is microseconds wide, so the check itself is tested here.
func TestCurrentDetectsAPrunedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "x.lock")
	fl := flock.New(path)
	if ok, err := fl.TryLock(); !ok || err != nil {
		t.Fatal(ok, err)
	}
	defer fl.Close()
	if !current(fl, path) {
		t.Fatal("a fresh lock is not current")
	}
	os.Remove(path)
	if current(fl, path) {
		t.Fatal("a removed file is current")
	}
	os.WriteFile(path, nil, 0o600)
	if current(fl, path) {
		t.Fatal("a replaced file is current")
	}
}

func TestTryLockFailsWhileHeldAndSucceedsAfter(t *testing.T) {
	dir := t.TempDir()
	a, _ := New(dir, time.Second, nil)
	b, _ := New(dir, time.Second, nil)
	release, _ := a.Lock(context.Background(), "vm-3")
	if _, ok, err := b.TryLock("vm-3"); ok || err != nil {
		t.Fatalf("TryLock of a held lock: ok=%v err=%v", ok, err)
	}
	release()
	r2, ok, err := b.TryLock("vm-3")
	if !ok || err != nil {
		t.Fatalf("TryLock of a free lock: ok=%v err=%v", ok, err)
	}
	r2()
}
