package orchestrator

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// The stemcell key is the SHA-256 of image, cloud properties and CPI, as
// stores made before the hash was cached hold it; the image is read
// again when it changes, not at every spawn.
func TestStemcellKeyCachedUntilTheImageChanges(t *testing.T) {
	img := filepath.Join(t.TempDir(), "stemcell.tgz")
	if err := os.WriteFile(img, []byte("image one"), 0o600); err != nil {
		t.Fatal(err)
	}
	sc := config.StemcellConfig{Image: img, CloudProperties: map[string]any{"k": "v"}}
	want := func(content string) string {
		props, _ := json.Marshal(sc.CloudProperties)
		sum := sha256.Sum256([]byte(content + string(props) + "cpi|cfg"))
		return hex.EncodeToString(sum[:])
	}
	o := &stemcells{}
	k1, err := o.key("cpi|cfg", sc)
	if err != nil || k1 != want("image one") {
		t.Fatalf("key %s (%v), want %s", k1, err, want("image one"))
	}
	if k, _ := o.key("other|cfg", sc); k == k1 {
		t.Error("another CPI, the same key")
	}
	// Rewritten: another size and modification time.
	if err := os.WriteFile(img, []byte("image two, longer"), 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	os.Chtimes(img, later, later)
	if k, _ := o.key("cpi|cfg", sc); k != want("image two, longer") {
		t.Errorf("after the image changed: %s, want %s", k, want("image two, longer"))
	}
}
