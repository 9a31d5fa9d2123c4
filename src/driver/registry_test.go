package driver

import (
	"testing"

	"github.com/runway-cpi/runway/src/config"
)

type testConfig struct {
	Region string `json:"region"`
}

func TestRegisterRefusesAContextKeyThatIsNoConfigKey(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("no panic")
		}
	}()
	Register(Registration{Section: config.Section{Name: "broken", Config: &testConfig{}, ContextKeys: []string{"nope"}}})
}
