// Command monit-agent-api is the dev stemcell's front to monit's HTTP API
// for bosh-agent (scripts/rootfs-dev bosh; docs/bosh-lite.md).
//
// bosh-agent drives monit as monit 5.2 answered, which real stemcells
// carry: `POST /<service>` with `action=start|stop|unmonitor`, basic auth
// and no CSRF token, and `GET /_status2?format=xml`
// (cloudfoundry/bosh-agent: jobsupervisor/monit/http_client.go). Debian's
// monit 5.33, the only monit Debian packages, refuses such a POST with
// "403 Invalid CSRF Token": it wants the double-submit token its own CLI
// sends, a `securitytoken` cookie equal to a `securitytoken` form field.
// This front listens where the agent connects (127.0.0.1:2822) and passes
// every request unchanged to monit's HTTP interface on a unix socket,
// where monit checks the credentials itself, except that a form POST
// carrying no token gets one of its own, in both places, as monit's CLI
// does. While monit is down it answers 503, which the agent retries as
// it retries a monit still starting.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"time"
)

// maxForm is the largest POST body read to add a token (monit's own forms
// are a few dozen bytes); a larger one is passed on as it is.
const maxForm = 64 << 10

func main() {
	listen := flag.String("listen", "127.0.0.1:2822", "where bosh-agent connects")
	socket := flag.String("monit", "/var/vcap/monit/monit.sock", "monit's HTTP interface (monitrc: set httpd unixsocket)")
	flag.Parse()
	srv := &http.Server{Addr: *listen, Handler: Handler(*socket), ReadHeaderTimeout: 30 * time.Second}
	fmt.Fprintf(os.Stderr, "monit-agent-api: %s -> unix:%s\n", *listen, *socket)
	log.Fatal(srv.ListenAndServe())
}

// Handler passes requests to monit's HTTP interface on the unix socket.
func Handler(socket string) http.Handler {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		DisableKeepAlives: true, // monit answers HTTP/1.0 and closes
	}
	return &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme, r.Out.URL.Host = "http", "monit"
			r.Out.Host = r.In.Host
			if err := addToken(r.Out); err != nil {
				log.Printf("monit-agent-api: %s %s: %v", r.In.Method, r.In.URL.Path, err)
			}
		},
		Transport: tr,
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			http.Error(w, "monit is not running: "+err.Error(), http.StatusServiceUnavailable)
		},
	}
}

// addToken gives a form POST without a securitytoken field a fresh token,
// as the field and as the cookie monit compares it with.
func addToken(r *http.Request) error {
	if r.Method != http.MethodPost || r.Body == nil {
		return nil
	}
	orig := r.Body
	body, err := io.ReadAll(io.LimitReader(orig, maxForm+1))
	if err != nil {
		return err
	}
	if len(body) > maxForm { // the rest still to come, as it is
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), orig), orig}
		return fmt.Errorf("form of more than %d bytes passed on without a token", maxForm)
	}
	orig.Close()
	setBody(r, body)
	form, err := url.ParseQuery(string(body))
	if err != nil || form.Has("securitytoken") {
		return err
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return err
	}
	token := hex.EncodeToString(b)
	if len(body) > 0 {
		body = append(body, '&')
	}
	setBody(r, append(body, "securitytoken="+token...))
	r.AddCookie(&http.Cookie{Name: "securitytoken", Value: token})
	return nil
}

func setBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Set("Content-Length", strconv.Itoa(len(body)))
}
