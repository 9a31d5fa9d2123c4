package forge

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// GiteaAPI is a Gitea-family instance's REST API (Gitea's and Forgejo's:
// /api/v1 under the instance URL) over a client carrying its token.
type GiteaAPI struct {
	Base string // the instance URL, without /api/v1
	HTTP *http.Client
}

// NewGiteaAPI is the API of the instance at baseURL (without /api/v1)
// over t.
func NewGiteaAPI(baseURL string, t *Transport) GiteaAPI {
	return GiteaAPI{Base: strings.TrimRight(baseURL, "/"), HTTP: t.Client()}
}

// Do is one request of the API (path with its query), by DoJSON.
func (a GiteaAPI) Do(ctx context.Context, method, path string, in, out any) error {
	return DoJSON(ctx, a.HTTP, method, a.Base+"/api/v1"+path, in, out)
}

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
