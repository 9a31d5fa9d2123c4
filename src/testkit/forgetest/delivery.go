package forgetest

import (
	"net/http"
	"testing"
)

// CheckVerifyDelivery holds a forge client's webhook check (verify) to
// the forge's signing: a delivery signed as sign signs it is verified;
// one under another secret, with its body changed, unsigned, signed with
// an empty secret, or carrying any of forged's headers is not.
func CheckVerifyDelivery(t *testing.T, verify func(secret, body []byte, h http.Header) bool,
	sign func(secret, body []byte) http.Header, forged func(secret, body []byte) map[string]http.Header) {
	t.Helper()
	body := []byte(`{"action":"queued"}`)
	secret := []byte("s3cret")
	good := sign(secret, body)
	if !verify(secret, body, good) {
		t.Error("a good signature was refused")
	}
	cases := map[string]struct {
		secret, body []byte
		h            http.Header
	}{
		"wrong secret": {[]byte("other"), body, good},
		"changed body": {secret, append(body, ' '), good},
		"unsigned":     {secret, body, http.Header{}},
		"empty secret": {nil, body, sign(nil, body)},
	}
	for name, h := range forged(secret, body) {
		cases[name] = struct {
			secret, body []byte
			h            http.Header
		}{secret, body, h}
	}
	for name, tc := range cases {
		if verify(tc.secret, tc.body, tc.h) {
			t.Errorf("%s: verified", name)
		}
	}
}
