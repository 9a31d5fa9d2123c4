// Package console keeps a VM's console log within a size: console.log up
// to the cap, then it becomes console.log.1 (replacing the one before) and
// a new console.log starts. A VM that writes forever costs the host two
// caps of disk, whatever it writes.
package console

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
)

// Log is a console log file capped at Max bytes, rotated once.
type Log struct {
	Path string
	Max  int64

	mu   sync.Mutex
	f    *os.File
	size int64
}

// Open opens (appending to) the log at path.
func Open(path string, max int64) (*Log, error) {
	if max <= 0 {
		return nil, fmt.Errorf("console: a cap of %d bytes", max)
	}
	l := &Log{Path: path, Max: max}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *Log) open() error {
	f, err := os.OpenFile(l.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return err
	}
	l.f, l.size = f, st.Size()
	return nil
}

// rotate moves the full log aside and starts a new one.
func (l *Log) rotate() error {
	l.f.Close()
	if err := os.Rename(l.Path, l.Path+".1"); err != nil {
		return err
	}
	return l.open()
}

// Write appends p, rotating whenever the log reaches its cap; a write
// larger than the cap keeps only its last cap bytes.
func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	if int64(len(p)) > l.Max {
		p = p[int64(len(p))-l.Max:]
	}
	for len(p) > 0 {
		room := l.Max - l.size
		if room <= 0 {
			if err := l.rotate(); err != nil {
				return 0, err
			}
			continue
		}
		chunk := p
		if int64(len(chunk)) > room {
			chunk = chunk[:room]
		}
		w, err := l.f.Write(chunk)
		l.size += int64(w)
		if err != nil {
			return 0, err
		}
		p = p[w:]
	}
	return n, nil
}

// Close closes the log.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.f.Close()
}

// Env names the log a process-mode VM's output goes to; EnvMax its cap.
const (
	Env    = "RUNWAY_CONSOLE_LOG"
	EnvMax = "RUNWAY_CONSOLE_MAX"
)

// Served copies standard input into the log Env names, capped at EnvMax,
// and exits, when this process was started for that (the end of a
// process-mode VM's output pipe); otherwise it returns at once. The
// driver's executable calls it first thing in its main.
func Served() {
	path := os.Getenv(Env)
	if path == "" {
		return
	}
	max, err := strconv.ParseInt(os.Getenv(EnvMax), 10, 64)
	if err != nil {
		os.Exit(2)
	}
	l, err := Open(path, max)
	if err != nil {
		os.Exit(1)
	}
	_, _ = io.Copy(l, os.Stdin)
	l.Close()
	os.Exit(0)
}
