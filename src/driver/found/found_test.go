package found

import (
	"errors"
	"fmt"
	"testing"
)

func TestAnswer(t *testing.T) {
	gone := errors.New("vm not found")
	other := errors.New("timeout")
	for _, tc := range []struct {
		err  error
		ok   bool
		want error
	}{
		{nil, true, nil},
		{fmt.Errorf("server x: %w", gone), false, nil},
		{other, false, other},
	} {
		ok, err := Answer(tc.err, gone)
		if ok != tc.ok || err != tc.want {
			t.Errorf("Answer(%v) = %v, %v; want %v, %v", tc.err, ok, err, tc.ok, tc.want)
		}
	}
}
