package forgetest

// What both contract servers share: webhook deliveries and JSON answers.

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"sync"
)

// hook is a webhook: where deliveries go and the secret signing them.
type hook struct {
	url    string
	secret []byte
}

// send posts one delivery in the background, as a forge's hook queue does.
func (h hook) send(wg *sync.WaitGroup, body []byte, headers map[string]string) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		req, _ := http.NewRequest("POST", h.url, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	}()
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func randUUID() string {
	h := randHex(16)
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
