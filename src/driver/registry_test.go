package driver

import (
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/config"
)

type testConfig struct {
	Region string `json:"region"`
}

func TestRegisterRefusesAContextKeyThatIsNoConfigKey(t *testing.T) {
	// A name in the driver table (none is registered in this test), so
	// the context key is what is refused.
	defer func() {
		if msg, _ := recover().(string); !strings.Contains(msg, "context key nope is not a config key") {
			t.Fatalf("panic %q, want the context key refused", msg)
		}
	}()
	Register(Registration{Section: config.Section{Name: "local", Config: &testConfig{}, ContextKeys: []string{"nope"}}})
}
