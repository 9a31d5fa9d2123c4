package vsphere

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/vmware/govmomi/fault"
	govsession "github.com/vmware/govmomi/session"
	"github.com/vmware/govmomi/vim25"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"

	"github.com/runway-cpi/runway/src/driver/statecache"
	"github.com/runway-cpi/runway/src/retry"
)

// session is the SOAP client, logged in, whose round tripper renews an
// expired session once per failed call and keeps each call inside the
// wait budget.
type session struct {
	d      *Driver
	sc     *soap.Client
	raw    *vim25.Client // without the wrapper: login only
	client *vim25.Client
	mu     sync.Mutex
}

// sessionCookie is vCenter's session cookie name.
const sessionCookie = "vmware_soap_session"

func (d *Driver) newSession(ctx context.Context) (*session, error) {
	u := d.cfg.sdkURL()
	sc := soap.NewClient(u, d.cfg.Insecure)
	tc, err := d.cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	sc.DefaultTransport().TLSClientConfig = tc
	sc.Timeout = d.cfg.requestTimeout()
	sc.Client.Transport = &countingTransport{base: sc.DefaultTransport(), n: &d.requests}
	s := &session{d: d, sc: sc}
	var raw *vim25.Client
	err = d.Retry.Do(ctx, "vsphere connect", func(ctx context.Context) error {
		var err error
		raw, err = vim25.NewClient(ctx, sc)
		return err
	})
	if err != nil {
		return nil, d.connectErr(err)
	}
	s.raw = raw
	c := *raw
	c.RoundTripper = s
	s.client = &c
	if d.cfg.sessionCache() && s.restore() {
		d.Log.Debug("reusing the cached vCenter session", "host", d.cfg.hostName())
		return s, nil
	}
	if err := s.login(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// connectErr says what to fix when vCenter cannot be reached or trusted.
func (d *Driver) connectErr(err error) error {
	if soap.IsCertificateUntrusted(err) {
		return fmt.Errorf("vsphere: %s's certificate is not trusted: set connection_options.ca_cert to the CA that signed it: %w", d.cfg.hostName(), err)
	}
	return fmt.Errorf("vsphere: connecting to %s: %w", d.cfg.hostName(), err)
}

// login opens a session and keeps its cookie for the next process.
func (s *session) login(ctx context.Context) error {
	d := s.d
	err := d.Retry.Do(ctx, "vsphere login", func(ctx context.Context) error {
		return govsession.NewManager(s.raw).Login(ctx, url.UserPassword(d.cfg.User, d.cfg.Password))
	})
	if err != nil {
		if fault.Is(err, &types.InvalidLogin{}) {
			return fmt.Errorf("vsphere: %s refused user %q's login: check user and password", d.cfg.hostName(), d.cfg.User)
		}
		return d.connectErr(err)
	}
	d.Log.Debug("logged in to vCenter", "host", d.cfg.hostName(), "user", d.cfg.User)
	if d.cfg.sessionCache() {
		s.save()
	}
	return nil
}

// RoundTrip is every SOAP call: an expired session (NotAuthenticated) is
// renewed and the call sent again, once.
func (s *session) RoundTrip(ctx context.Context, req, res soap.HasFault) error {
	method := methodName(req)
	err := s.d.Retry.Do(ctx, "vsphere "+method, func(ctx context.Context) error {
		resetFault(res)
		err := s.sc.RoundTrip(ctx, req, res)
		if err == nil {
			err = missingAuth(res)
		}
		if err != nil && idempotent(method) {
			return retryable{err}
		}
		return err
	})
	err = unwrapRetryable(err)
	if err == nil || !fault.Is(err, &types.NotAuthenticated{}) || method == "Logout" {
		return err
	}
	s.mu.Lock()
	lerr := s.login(ctx)
	s.mu.Unlock()
	if lerr != nil {
		return fmt.Errorf("%w (renewing the session: %v)", err, lerr)
	}
	s.d.Log.Info("vCenter session had expired: logged in again", "method", method)
	return s.d.Retry.Do(ctx, "vsphere "+method, func(ctx context.Context) error {
		resetFault(res)
		if err := s.sc.RoundTrip(ctx, req, res); err != nil {
			return err
		}
		return missingAuth(res)
	})
}

// resetFault clears an answer's fault before the call is sent again: the
// decoder fills only what the new answer holds, so a fault of the last
// one would stay and read as this one's.
func resetFault(res soap.HasFault) {
	v := reflect.ValueOf(res)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		return
	}
	for _, name := range []string{"Fault_", "Res"} {
		if f := v.Elem().FieldByName(name); f.IsValid() && f.CanSet() {
			f.Set(reflect.Zero(f.Type()))
		}
	}
}

// errPropertiesNotAuthenticated: vcsim answers an expired session's
// property reads with NotAuthenticated in each object's missingSet (a
// vCenter answers a fault); either way the session is renewed.
var errPropertiesNotAuthenticated = soap.WrapVimFault(&types.NotAuthenticated{})

func missingAuth(res soap.HasFault) error {
	var objs []types.ObjectContent
	switch r := res.(type) {
	case *methods.RetrievePropertiesExBody:
		if r.Res != nil && r.Res.Returnval != nil {
			objs = r.Res.Returnval.Objects
		}
	case *methods.RetrievePropertiesBody:
		if r.Res != nil {
			objs = r.Res.Returnval
		}
	}
	for _, o := range objs {
		for _, m := range o.MissingSet {
			if _, ok := m.Fault.Fault.(*types.NotAuthenticated); ok {
				return errPropertiesNotAuthenticated
			}
		}
	}
	return nil
}

// retryable marks an error of a call that reads only, so a transport
// fault is worth sending it again.
type retryable struct{ err error }

func (r retryable) Error() string { return r.err.Error() }
func (r retryable) Unwrap() error { return r.err }

func unwrapRetryable(err error) error {
	var r retryable
	if errors.As(err, &r) {
		return r.err
	}
	return err
}

// methodName is a SOAP body's method (methods.CloneVM_TaskBody → CloneVM_Task).
func methodName(req soap.HasFault) string {
	t := reflect.TypeOf(req)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return strings.TrimSuffix(t.Name(), "Body")
}

// idempotent methods read only: a reset or a 5xx may be retried.
func idempotent(method string) bool {
	for _, p := range []string{"Retrieve", "Find", "Query", "Search", "WaitFor", "CurrentTime", "Browse"} {
		if strings.HasPrefix(method, p) {
			return true
		}
	}
	return false
}

// classify is the wait budget's verdict: a throttled answer (503, 429) is
// waited out for any call (vCenter's proxy refused it before it ran); a
// transport fault only for calls that read.
func classify(err error) retry.Verdict {
	var t *throttled
	if errors.As(err, &t) {
		return retry.Verdict{Class: retry.Throttle, RetryAfter: t.after}
	}
	var r retryable
	if !errors.As(err, &r) {
		return retry.Verdict{Class: retry.Permanent}
	}
	if soap.IsSoapFault(err) || soap.IsVimFault(err) {
		if fault.IsTransientError(err) {
			return retry.Verdict{Class: retry.Transient}
		}
		return retry.Verdict{Class: retry.Permanent}
	}
	return retry.Network(err)
}

// throttled is an HTTP 503 or 429 answer.
type throttled struct {
	status int
	after  time.Duration
}

func (t *throttled) Error() string {
	return fmt.Sprintf("vCenter answered %d %s (throttled)", t.status, http.StatusText(t.status))
}

// countingTransport counts requests and turns throttled answers into an
// error the wait budget recognises.
type countingTransport struct {
	base http.RoundTripper
	n    interface{ Add(int64) int64 }
}

func (c *countingTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	res, err := c.base.RoundTrip(r)
	if err != nil {
		return nil, err
	}
	if res.StatusCode == http.StatusServiceUnavailable || res.StatusCode == http.StatusTooManyRequests {
		_, _ = io.Copy(io.Discard, io.LimitReader(res.Body, 64<<10))
		_ = res.Body.Close()
		return nil, &throttled{status: res.StatusCode, after: retry.ParseRetryAfter(res.Header.Get("Retry-After"), time.Now())}
	}
	return res, nil
}

// The session cache: the cookie of the last login, 0600 in the state dir,
// keyed by vCenter, user and password (a changed password logs in anew).
type cachedSession struct {
	Cookie string `json:"cookie"`
}

func (s *session) cachePath() string {
	return filepath.Join(s.d.stateDir, "vsphere", "session-"+statecache.Name(12, s.d.cfg.Host, s.d.cfg.User, s.d.cfg.Password)+".json")
}

func (s *session) restore() bool {
	if s.d.stateDir == "" {
		return false
	}
	cs := statecache.Read[cachedSession](s.cachePath())
	if cs == nil || cs.Cookie == "" {
		return false
	}
	s.sc.Jar.SetCookies(s.d.cfg.sdkURL(), []*http.Cookie{{Name: sessionCookie, Value: cs.Cookie}})
	return true
}

func (s *session) save() {
	if s.d.stateDir == "" {
		return
	}
	var cookie string
	for _, c := range s.sc.Jar.Cookies(s.d.cfg.sdkURL()) {
		if c.Name == sessionCookie {
			cookie = c.Value
		}
	}
	if cookie == "" {
		return
	}
	p := s.cachePath()
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return
	}
	if err := statecache.Write(p, cachedSession{Cookie: cookie}); err != nil {
		s.d.Log.Warn("cannot keep the vCenter session", "err", err)
	}
}
