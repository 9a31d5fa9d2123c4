package netns

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// Add makes a network namespace for a test, named prefix and the test
// process's pid (so two runs at once do not meet), with its loopback up;
// it goes when the test ends. It answers the name.
func Add(t testing.TB, prefix string) string {
	t.Helper()
	name := prefix + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	if out, err := exec.Command("ip", "-n", name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s link set lo up: %v: %s", name, err, out)
	}
	return name
}
