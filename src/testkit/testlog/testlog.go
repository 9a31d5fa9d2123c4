// Package testlog keeps what a test's logger writes, for the test to
// read and to show when it fails.
package testlog

import (
	"bytes"
	"sync"
	"testing"
)

// Buffer keeps what is written to it; writers may be concurrent (a
// driver's goroutines, a listener's loop) with readers.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// ShownOnFailure is a Buffer that t logs, headed what, if t has failed
// by its end.
func ShownOnFailure(t testing.TB, what string) *Buffer {
	b := &Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s:\n%s", what, b.String())
		}
	})
	return b
}
