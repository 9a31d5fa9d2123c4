package netns

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A namespace made for a test has its loopback up and is gone when the
// test ends.
func TestAdd(t *testing.T) {
	var ns string
	t.Run("made", func(t *testing.T) {
		ns = Add(t, "rwnetnstest")
		if out, err := exec.Command("ip", "-n", ns, "-o", "link", "show", "lo").CombinedOutput(); err != nil || !strings.Contains(string(out), ",UP") {
			t.Errorf("lo: %s (%v)", out, err)
		}
	})
	if _, err := os.Stat("/run/netns/" + ns); !os.IsNotExist(err) {
		t.Errorf("namespace %s left after its test: %v", ns, err)
	}
}
