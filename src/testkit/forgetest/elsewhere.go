package forgetest

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// Elsewhere serves, until the test ends, what a forge URL aimed at
// something else reaches (here a kube-apiserver): every request is
// refused, 403, with the server's own words holding marker (which no
// brief error may carry back to the URL's author). It answers its URL.
func Elsewhere(t testing.TB, marker string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, `{"kind":"Status","message":"forbidden: %s cannot get path /api/v1/orgs"}`, marker)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// CanaryURLAt is a URL of hostport (a forge's, an IaaS endpoint's) with
// secrets in its user info and query, each holding "canary" (no output
// may carry it), and a path no redaction may drop: /keep-this-segment
// (it says where a request went).
func CanaryURLAt(hostport string) string {
	return "http://canary-user:canary-pass@" + hostport + "/keep-this-segment?token=canary-query"
}

// CanaryURL is CanaryURLAt a port where nothing listens: every request
// fails in the transport.
func CanaryURL(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	return CanaryURLAt(closed)
}
