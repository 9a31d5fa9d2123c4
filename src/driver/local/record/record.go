// Package record reads and writes the local driver's JSON records: each
// replaced atomically (a temporary file, then a rename), so a reader or
// a crash never sees half a record. The state dir's records, the host
// network's tables and a container VM's supervisor use it.
package record

import (
	"encoding/json"
	"fmt"
	"os"
)

// Read reads a record; a missing file is reported as fs.ErrNotExist.
func Read(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("corrupt record %s: %w", path, err)
	}
	return nil
}

// Write replaces a record atomically.
func Write(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return WriteFile(path, b)
}

// WriteFile replaces a file atomically: through a temporary file and a
// rename.
func WriteFile(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
