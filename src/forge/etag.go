package forge

import (
	"bytes"
	"io"
	"net/http"
	"strconv"
	"sync"
)

// ETagCache makes GETs conditional: the last 200 answer of each URL (per
// credential) is kept with its ETag and sent back as If-None-Match; a 304
// — which GitHub does not count against the rate limit — is answered to
// the library as that 200, marked with the FromCacheHeader. Answers
// without an ETag, and bodies over maxCachedBody, are not kept.
type ETagCache struct {
	Base http.RoundTripper

	mu      sync.Mutex
	entries map[string]*cached
	order   []string // oldest first, for eviction
}

// FromCacheHeader marks an answer served from the cache after a 304.
const FromCacheHeader = "X-Runway-From-Cache"

const (
	maxCachedURLs = 512
	maxCachedBody = 8 << 20
)

type cached struct {
	etag   string
	header http.Header
	body   []byte
}

// RoundTrip implements http.RoundTripper.
func (c *ETagCache) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet || req.Header.Get("If-None-Match") != "" {
		return c.Base.RoundTrip(req)
	}
	// The credential is part of the key: another token may see another
	// answer. It is only held in memory.
	key := req.Header.Get("Authorization") + " " + req.URL.String()
	c.mu.Lock()
	e := c.entries[key]
	c.mu.Unlock()
	if e != nil {
		req = req.Clone(req.Context())
		req.Header.Set("If-None-Match", e.etag)
	}
	resp, err := c.Base.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	switch {
	case resp.StatusCode == http.StatusNotModified && e != nil:
		resp.Body.Close()
		h := e.header.Clone()
		for k, v := range resp.Header { // the 304's rate-limit headers are current
			h[k] = v
		}
		h.Set(FromCacheHeader, "1")
		h.Set("Content-Length", strconv.Itoa(len(e.body)))
		return &http.Response{Status: "200 OK", StatusCode: http.StatusOK, Proto: resp.Proto, ProtoMajor: resp.ProtoMajor,
			ProtoMinor: resp.ProtoMinor, Header: h, Body: io.NopCloser(bytes.NewReader(e.body)),
			ContentLength: int64(len(e.body)), Request: req}, nil
	case resp.StatusCode == http.StatusOK && resp.Header.Get("ETag") != "":
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxCachedBody+1))
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		resp.Body = io.NopCloser(bytes.NewReader(body))
		if len(body) <= maxCachedBody {
			c.put(key, &cached{etag: resp.Header.Get("ETag"), header: resp.Header.Clone(), body: body})
		}
	}
	return resp, nil
}

func (c *ETagCache) put(key string, e *cached) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[string]*cached{}
	}
	if _, ok := c.entries[key]; !ok {
		c.order = append(c.order, key)
		if len(c.order) > maxCachedURLs {
			delete(c.entries, c.order[0])
			c.order = c.order[1:]
		}
	}
	c.entries[key] = e
}
