package statecache

import (
	"os"
	"path/filepath"
	"testing"
)

type entry struct {
	Cookie string `json:"cookie"`
}

func TestWriteThenRead(t *testing.T) {
	p := filepath.Join(t.TempDir(), "session-"+Name(12, "vc", "user", "secret")+".json")
	if Read[entry](p) != nil {
		t.Fatal("a missing file reads as an entry")
	}
	if err := Write(p, entry{Cookie: "c1"}); err != nil {
		t.Fatal(err)
	}
	if err := Write(p, entry{Cookie: "c2"}); err != nil {
		t.Fatal(err)
	}
	if got := Read[entry](p); got == nil || got.Cookie != "c2" {
		t.Fatalf("read %+v; want the last write", got)
	}
	st, err := os.Stat(p)
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v, %v; want 0600", st.Mode(), err)
	}
	left, _ := filepath.Glob(filepath.Join(filepath.Dir(p), ".*"))
	if len(left) != 0 {
		t.Errorf("temporary files left: %v", left)
	}
	if err := os.WriteFile(p, []byte("{half"), 0o600); err != nil {
		t.Fatal(err)
	}
	if Read[entry](p) != nil {
		t.Error("an unreadable file reads as an entry")
	}
}

func TestNameHidesAndSeparates(t *testing.T) {
	a, b := Name(8, "u", "ser"), Name(8, "us", "er")
	if a == b || len(a) != 16 {
		t.Errorf("Name = %q, %q; want 16 hex digits, different for different parts", a, b)
	}
}
