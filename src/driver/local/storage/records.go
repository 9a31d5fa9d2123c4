package storage

import (
	"encoding/json"
	"fmt"
	"os"
)

// ReadJSON reads a record; a missing file is reported as fs.ErrNotExist.
func ReadJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("corrupt record %s: %w", path, err)
	}
	return nil
}

// WriteJSON replaces a record atomically (temp file + rename), so a reader
// or a crash never sees half a record.
func WriteJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return WriteFileAtomic(path, b)
}

// WriteFileAtomic writes through a temporary file and a rename.
func WriteFileAtomic(path string, b []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
