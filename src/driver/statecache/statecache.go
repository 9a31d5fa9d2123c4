// Package statecache is what a cloud driver keeps between its processes
// in the state dir (a login's token or session cookie, a flavor list):
// JSON files named by a hash of what they belong to, so two clouds or
// identities never share one and no secret shows in a name, replaced
// atomically and readable by the CPI's user alone.
package statecache

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
)

// Name is the hex of the first n bytes of the SHA-256 of parts joined by
// NUL bytes: the part of a file's name that says whose it is.
func Name(n int, parts ...string) string {
	h := sha256.Sum256([]byte(strings.Join(parts, "\x00")))
	return hex.EncodeToString(h[:n])
}

// Read is the JSON in the file at path as a T; nil when the file is
// missing or unreadable (a cache only saves work).
func Read[T any](path string) *T {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var v T
	if json.Unmarshal(b, &v) != nil {
		return nil
	}
	return &v
}

// Write replaces the file at path with v as JSON: written to a new file
// (mode 0600) in the same directory, then renamed over it, so a reader
// never sees half a file and concurrent writers never share one.
func Write(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	_, err = tmp.Write(b)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		os.Remove(tmp.Name())
	}
	return err
}
