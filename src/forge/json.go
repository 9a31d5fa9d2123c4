package forge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// maxAnswer caps a forge answer read into memory.
const maxAnswer = 8 << 20

// DoJSON sends in (when not nil) as JSON and decodes a 2xx answer into out
// (when not nil); any other status is a ResponseError carrying the forge's
// own message. For the endpoints Gitea's and Forgejo's clients call
// without an SDK.
func DoJSON(ctx context.Context, hc *http.Client, method, url string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return RedactError(err)
	}
	req.Header.Set("Accept", "application/json")
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := hc.Do(req)
	if err != nil {
		return RedactError(err)
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(io.LimitReader(resp.Body, maxAnswer))
	if resp.StatusCode/100 != 2 {
		var m struct{ Message string }
		dec.Decode(&m)
		return ResponseError(resp, m.Message)
	}
	if out == nil || resp.StatusCode == http.StatusNoContent {
		return nil
	}
	if err := dec.Decode(out); err != nil {
		return fmt.Errorf("%s %s: decoding answer: %v", method, req.URL.Path, err)
	}
	return nil
}
