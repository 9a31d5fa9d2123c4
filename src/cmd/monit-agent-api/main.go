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
//
// One behaviour is mended too: bosh-agent stops a job after unmonitoring
// it (drain, then stop), and expects the stop to stop it
// (jobsupervisor/job_supervisor_interface.go: "Calling Stop after
// Unmonitor should not re-monitor all jobs", but stop them); monit 5.33
// ignores a stop for a service it does not monitor, the process lives on
// and holds /var/vcap/store. A stop for such a service is preceded by a
// monitor, awaited, as monit's own `monit monitor` then `monit stop`.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/xml"
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
	"strings"
	"time"

	"golang.org/x/text/encoding/charmap"
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
	proxy := &httputil.ReverseProxy{
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
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if service := stopOf(r); service != "" {
			m := monit{client: &http.Client{Transport: tr, Timeout: 5 * time.Second}, auth: r.Header.Get("Authorization")}
			if err := m.monitorFirst(r.Context(), service); err != nil {
				log.Printf("monit-agent-api: stop %s: %v", service, err)
			}
		}
		proxy.ServeHTTP(w, r)
	})
}

// stopOf answers the service a `POST /<service>` with action=stop names
// ("" for any other request); the body is left to be read again.
func stopOf(r *http.Request) string {
	name := strings.TrimPrefix(r.URL.Path, "/")
	if r.Method != http.MethodPost || r.Body == nil || name == "" || strings.ContainsAny(name, "/") {
		return ""
	}
	body, err := readForm(r)
	if err != nil {
		return ""
	}
	if form, err := url.ParseQuery(string(body)); err != nil || form.Get("action") != "stop" {
		return ""
	}
	return name
}

// monit is the front's own client of monit, with the agent's credentials.
type monit struct {
	client *http.Client
	auth   string
}

// monitorWait bounds the wait for monit to monitor a service again (its
// daemon cycle is 10 s; an action wakes it at once).
const monitorWait = 15 * time.Second

// monitorFirst has monit monitor service again when it does not, and
// waits until it does, so that a stop after it is carried out.
func (m monit) monitorFirst(ctx context.Context, service string) error {
	mon, err := m.monitored(ctx, service)
	if err != nil || mon != 0 {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://monit/"+url.PathEscape(service), strings.NewReader("action=monitor"))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if err := addToken(req); err != nil {
		return err
	}
	if err := m.do(req); err != nil {
		return err
	}
	deadline := time.Now().Add(monitorWait)
	for time.Now().Before(deadline) {
		if mon, err := m.monitored(ctx, service); err == nil && mon == 1 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("monit did not monitor it again within %s", monitorWait)
}

// monitored answers monit's monitor state of service (0 not, 1 yes, 2
// starting to), from the status the agent reads.
func (m monit) monitored(ctx context.Context, service string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://monit/_status2?format=xml", nil)
	if err != nil {
		return 0, err
	}
	var st struct {
		Services []struct {
			Name    string `xml:"name,attr"`
			Monitor int    `xml:"monitor"`
			Pending int    `xml:"pendingaction"`
		} `xml:"services>service"`
	}
	req.Header.Set("Authorization", m.auth)
	resp, err := m.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("status: %s", resp.Status)
	}
	dec := xml.NewDecoder(io.LimitReader(resp.Body, 1<<20))
	dec.CharsetReader = func(label string, r io.Reader) (io.Reader, error) {
		if !strings.EqualFold(label, "ISO-8859-1") { // what monit declares
			return nil, fmt.Errorf("encoding %q", label)
		}
		return charmap.ISO8859_1.NewDecoder().Reader(r), nil
	}
	if err := dec.Decode(&st); err != nil {
		return 0, fmt.Errorf("status: %w", err)
	}
	for _, s := range st.Services {
		if s.Name == service {
			if s.Pending != 0 {
				return 2, nil
			}
			return s.Monitor, nil
		}
	}
	return 0, fmt.Errorf("status: no service %q", service)
}

func (m monit) do(req *http.Request) error {
	req.Header.Set("Authorization", m.auth)
	resp, err := m.client.Do(req)
	if err != nil {
		return err
	}
	// Read to the end: monit logs a broken pipe for an answer not read.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode >= 300 {
		return fmt.Errorf("%s %s: %s", req.Method, req.URL.Path, resp.Status)
	}
	return nil
}

// addToken gives a form POST without a securitytoken field a fresh token,
// as the field and as the cookie monit compares it with.
func addToken(r *http.Request) error {
	if r.Method != http.MethodPost || r.Body == nil {
		return nil
	}
	body, err := readForm(r)
	if err != nil {
		return err
	}
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

// readForm reads a POST body of at most maxForm bytes and puts it back to
// be read again; a larger one is put back as it is, with an error.
func readForm(r *http.Request) ([]byte, error) {
	orig := r.Body
	body, err := io.ReadAll(io.LimitReader(orig, maxForm+1))
	if err != nil {
		return nil, err
	}
	if len(body) > maxForm { // the rest still to come, as it is
		r.Body = struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(body), orig), orig}
		return nil, fmt.Errorf("form of more than %d bytes passed on without a token", maxForm)
	}
	orig.Close()
	setBody(r, body)
	return body, nil
}

func setBody(r *http.Request, body []byte) {
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	r.Header.Set("Content-Length", strconv.Itoa(len(body)))
}
