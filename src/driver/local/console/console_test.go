package console

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Whatever a VM writes, the log and the one rotated copy stay within the
// cap each, and the newest output is kept.
func TestLogStaysWithinItsCap(t *testing.T) {
	path := filepath.Join(t.TempDir(), "console.log")
	l, err := Open(path, 1000)
	if err != nil {
		t.Fatal(err)
	}
	line := []byte(strings.Repeat("x", 99) + "\n")
	for range 500 { // 50 times the cap
		if _, err := l.Write(line); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Write(bytes.Repeat([]byte("y"), 5000)); err != nil { // one write past the cap
		t.Fatal(err)
	}
	if _, err := l.Write([]byte("the end\n")); err != nil {
		t.Fatal(err)
	}
	l.Close()
	cur, _ := os.ReadFile(path)
	old, _ := os.ReadFile(path + ".1")
	if len(cur) > 1000 || len(old) > 1000 {
		t.Errorf("console.log %d bytes, console.log.1 %d bytes; cap 1000", len(cur), len(old))
	}
	if !strings.HasSuffix(string(cur), "the end\n") {
		t.Errorf("the newest output is gone: %q", cur[max(0, len(cur)-20):])
	}
	if !strings.Contains(string(old)+string(cur), "yyyy") {
		t.Error("the big write left nothing")
	}
	// Opened again (a VM restarted), the log goes on from its size.
	l, err = Open(path, 1000)
	if err != nil {
		t.Fatal(err)
	}
	l.Write(bytes.Repeat([]byte("z"), 1000))
	l.Close()
	if cur, _ := os.ReadFile(path); len(cur) > 1000 {
		t.Errorf("after reopening: %d bytes", len(cur))
	}
}
