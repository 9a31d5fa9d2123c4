package ghapp

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

func pkcs1(k *rsa.PrivateKey) string {
	return string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}))
}

func pkcs8(t *testing.T, k *rsa.PrivateKey) string {
	b, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: b}))
}

var (
	keyOnce sync.Once
	appKey  *rsa.PrivateKey
)

// key is the test App's key (2048 bits, made once: RSA generation is slow).
func key(t *testing.T) *rsa.PrivateKey {
	keyOnce.Do(func() {
		var err error
		if appKey, err = rsa.GenerateKey(rand.Reader, 2048); err != nil {
			t.Fatal(err)
		}
	})
	return appKey
}

// server is a GitHub contract server where App 123 is installed (42).
func server(t *testing.T) *forgetest.GitHub {
	g := forgetest.NewGitHub("pat")
	t.Cleanup(g.Close)
	g.AddApp("123", &key(t).PublicKey, 42)
	return g
}

// clock is a settable time.
type clock struct{ off atomic.Int64 }

func (c *clock) now() time.Time          { return time.Now().Add(time.Duration(c.off.Load())) }
func (c *clock) advance(d time.Duration) { c.off.Add(int64(d)) }
func fixed(c Credentials) func() (Credentials, error) {
	return func() (Credentials, error) { return c, nil }
}

func newApp(g *forgetest.GitHub, c Credentials) (*App, *clock) {
	a := New(g.URL, forge.NewTransport(nil), fixed(c))
	clk := &clock{}
	a.now = clk.now
	return a, clk
}

// An installation token is minted with the App's JWT (PKCS#1 or PKCS#8
// key), kept while it lasts, and works on the REST API.
func TestTokenMintedOnceAndKept(t *testing.T) {
	g := server(t)
	for name, pemText := range map[string]string{"pkcs1": pkcs1(key(t)), "pkcs8": pkcs8(t, key(t))} {
		a, _ := newApp(g, Credentials{AppID: "123", InstallationID: 42, PrivateKey: pemText})
		ctx := context.Background()
		tok, err := a.Token(ctx)
		if err != nil || !strings.HasPrefix(tok, "ghs_") {
			t.Fatalf("%s: %q, %v", name, tok, err)
		}
		again, err := a.Token(ctx)
		if err != nil || again != tok || a.Mints() != 1 {
			t.Errorf("%s: a second call minted again (%d mints)", name, a.Mints())
		}
	}
	if st := g.AppStats(); st.Minted != 2 || st.Refused != 0 {
		t.Errorf("server saw %+v", st)
	}
}

// gate holds the second mint (the refresh) until released; others pass.
type gate struct {
	base    http.RoundTripper
	mints   atomic.Int32
	held    chan struct{}
	release chan struct{}
}

func (g *gate) RoundTrip(r *http.Request) (*http.Response, error) {
	if strings.HasSuffix(r.URL.Path, "/access_tokens") && g.mints.Add(1) == 2 {
		close(g.held)
		<-g.release
	}
	return g.base.RoundTrip(r)
}

// Near its expiry the token is minted again by one caller, however many
// ask meanwhile: they go on with the kept token while the mint is under
// way.
func TestRefreshedOnceUnderLoad(t *testing.T) {
	g := server(t)
	g.SetInstallationTokenTTL(10 * time.Second)
	tr := forge.NewTransport(nil)
	gt := &gate{base: tr.Base, held: make(chan struct{}), release: make(chan struct{})}
	tr.Base = gt
	a := New(g.URL, tr, fixed(Credentials{AppID: "123", InstallationID: 42, PrivateKey: pkcs1(key(t))}))
	clk := &clock{}
	a.now = clk.now
	first, err := a.Token(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Into the refresh window: past the margin, short of half of it
	// (relative to the expiry GitHub gave, in whole seconds: a fixed step
	// of 8.5 s overshot it whenever the mint's second was late, and the
	// callers then waited for the held mint for ever).
	a.mu.Lock()
	into := a.exp.Add(-a.margin * 3 / 4)
	a.mu.Unlock()
	clk.advance(into.Sub(clk.now()))
	refreshed := make(chan string)
	go func() {
		tok, _ := a.Token(context.Background())
		refreshed <- tok
	}()
	<-gt.held // the refresh is under way
	for range 49 {
		if tok, err := a.Token(context.Background()); err != nil || tok != first {
			t.Fatalf("during the refresh: %v; want the kept token", err)
		}
	}
	close(gt.release)
	next := <-refreshed
	if n := gt.mints.Load(); n != 2 || next == first {
		t.Errorf("%d mints for 50 callers at the refresh; want 2 (the first, then one)", n)
	}
	if latest, _ := a.Token(context.Background()); latest != next || g.AppStats().Minted != 2 {
		t.Errorf("after the refresh: another token, or %d minted", g.AppStats().Minted)
	}
}

// A key GitHub does not hold for the App is refused: the error says so
// (401) and holds neither key nor JWT; callers at once share the one
// failure rather than each minting.
func TestWrongKeyRefusedOnce(t *testing.T) {
	g := server(t)
	other, _ := rsa.GenerateKey(rand.Reader, 2048)
	pemText := pkcs1(other)
	a, _ := newApp(g, Credentials{AppID: "123", InstallationID: 42, PrivateKey: pemText})
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := a.Token(context.Background())
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		var ae *forge.APIError
		if !errors.As(err, &ae) || ae.Status != 401 {
			t.Fatalf("error %v; want the 401", err)
		}
		if strings.Contains(err.Error(), "PRIVATE KEY") || strings.Contains(err.Error(), "eyJ") {
			t.Errorf("error %q holds the key or the JWT", err)
		}
	}
	if st := g.AppStats(); st.Refused != 1 {
		t.Errorf("%d JWTs refused; want 1 (the failure shared, not retried by each caller)", st.Refused)
	}
}

// Keys that are not an RSA key in PEM are refused without being quoted.
func TestBadKeysNamedNotQuoted(t *testing.T) {
	for _, bad := range []string{"", "not a key", "-----BEGIN RSA PRIVATE KEY-----\nc2VjcmV0\n-----END RSA PRIVATE KEY-----\n"} {
		_, err := ParseKey(bad)
		if !errors.Is(err, ErrKey) || (bad != "" && strings.Contains(err.Error(), bad)) || strings.Contains(err.Error(), "c2VjcmV0") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// A token the forge refuses (revoked early) is not sent again: the next
// request mints a new one.
func TestRefusedTokenDropped(t *testing.T) {
	g := server(t)
	a, _ := newApp(g, Credentials{AppID: "123", InstallationID: 42, PrivateKey: pkcs1(key(t))})
	tok, _ := a.Token(context.Background())
	a.Refused("Bearer " + tok)
	if next, err := a.Token(context.Background()); err != nil || next == tok || a.Mints() != 2 {
		t.Errorf("after a refusal: %v, %d mints; want a new token", err, a.Mints())
	}
}

// Through a forge transport, the REST API gets the installation token.
func TestTransportSendsTheInstallationToken(t *testing.T) {
	g := server(t)
	a, _ := newApp(g, Credentials{AppID: "123", InstallationID: 42, PrivateKey: pkcs1(key(t))})
	tr := forge.NewTransport(nil)
	tr.Cred = a
	resp, err := tr.Client().Get(g.URL + "/orgs/acme/actions/runners")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("the runner list with the App's token: %d", resp.StatusCode)
	}
}
