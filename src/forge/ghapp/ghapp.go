// Package ghapp authenticates Runway as a GitHub App installation, as
// GitHub's documentation describes it ("Generating a JSON Web Token (JWT)
// for a GitHub App", "Generating an installation access token"): a JWT
// signed RS256 with the App's private key (iss the App's id or client id,
// iat a minute in the past against clock drift, exp at most ten minutes
// on), exchanged at POST /app/installations/{id}/access_tokens for an
// installation token that lasts an hour. The token is kept and used until
// shortly before it expires; then one request mints the next while the
// others go on with the current one (no thundering herd). The key is
// read at each mint (a rotated key needs no restart) and never appears in
// an error or a log line; neither does a token.
package ghapp

import (
	"bytes"
	"context"
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runway-cpi/runway/src/forge"
)

// Credentials are an App installation's: the App's id (or client id),
// the installation's id, and the App's private key (PEM: PKCS#1, as
// GitHub hands it out, or PKCS#8).
type Credentials struct {
	AppID          string
	InstallationID int64
	PrivateKey     string
}

// ErrKey: the private key is not an RSA private key in PEM.
var ErrKey = errors.New("the GitHub App's private key is not an RSA private key in PEM (PKCS#1 or PKCS#8)")

// ParseKey reads an App's private key. Its error never quotes the key.
func ParseKey(pemText string) (*rsa.PrivateKey, error) {
	block, _ := pem.Decode([]byte(strings.TrimSpace(pemText)))
	if block == nil {
		return nil, ErrKey
	}
	if k, err := x509.ParsePKCS1PrivateKey(block.Bytes); err == nil {
		return k, nil
	}
	k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
	if rk, ok := k.(*rsa.PrivateKey); err == nil && ok {
		return rk, nil
	}
	return nil, ErrKey
}

// JWT signs the App's JWT for now: iat a minute back, exp eight
// minutes on (nine apart, under GitHub's ten).
func JWT(appID string, key *rsa.PrivateKey, now time.Time) (string, error) {
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"RS256","typ":"JWT"}`))
	claims, err := json.Marshal(map[string]any{"iss": appID, "iat": now.Add(-time.Minute).Unix(), "exp": now.Add(8 * time.Minute).Unix()})
	if err != nil {
		return "", err
	}
	body := head + "." + enc.EncodeToString(claims)
	sum := sha256.Sum256([]byte(body))
	sig, err := rsa.SignPKCS1v15(rand.Reader, key, crypto.SHA256, sum[:])
	if err != nil {
		return "", err
	}
	return body + "." + enc.EncodeToString(sig), nil
}

// App mints and keeps an installation's token. Safe for concurrent use.
type App struct {
	api   string
	creds func() (Credentials, error)
	hc    *http.Client
	now   func() time.Time
	// OnToken hears each token minted (the daemon's redactor learns it).
	OnToken func(string)

	mu       sync.Mutex
	token    string
	exp      time.Time
	margin   time.Duration // refreshed this long before exp
	fp       string        // the credentials the token was minted with
	key      *rsa.PrivateKey
	keyFP    string
	inflight chan struct{} // closed when the mint under way ends
	gen      int           // mints ended
	lastErr  error         // the last mint's failure
	retryAt  time.Time     // no mint before, after a failure
	mints    int
}

// New is an App minting at apiURL (https://api.github.com, GHES
// https://host/api/v3) over t (no credential of its own: it carries the
// JWT), reading the credentials at each mint.
func New(apiURL string, t *forge.Transport, creds func() (Credentials, error)) *App {
	return &App{api: strings.TrimRight(apiURL, "/"), creds: creds, hc: t.Client(), now: time.Now}
}

// Authorization implements forge.Credential: "Bearer <installation
// token>".
func (a *App) Authorization(ctx context.Context) (string, error) {
	tok, err := a.Token(ctx)
	if err != nil {
		return "", err
	}
	return "Bearer " + tok, nil
}

// Refused implements forge.Credential: the forge refused a request made
// with value (a token revoked early): the next request mints anew.
func (a *App) Refused(value string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if value == "Bearer "+a.token {
		a.token, a.exp = "", time.Time{}
	}
}

// Mints counts the installation tokens minted.
func (a *App) Mints() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.mints
}

// Token is a current installation token: the kept one until its margin
// before expiry; then one caller mints the next while the others use the
// kept one as long as it is still valid, or wait for that mint (and share
// its failure: a failing mint is not tried again for retryPause).
func (a *App) Token(ctx context.Context) (string, error) {
	c, err := a.creds()
	if err != nil {
		return "", fmt.Errorf("the GitHub App's credentials: %w", err)
	}
	fp := fingerprint(c)
	a.mu.Lock()
	for {
		now := a.now()
		kept := a.token != "" && a.fp == fp && now.Before(a.exp)
		// The kept token serves while fresh; past that, while the next is
		// minted or after a failed mint, as long as it has half its margin
		// left (a request sent with it must not reach GitHub expired).
		spare := now.Before(a.exp.Add(-a.margin / 2))
		if kept && (now.Before(a.exp.Add(-a.margin)) || (spare && (a.inflight != nil || now.Before(a.retryAt)))) {
			tok := a.token
			a.mu.Unlock()
			return tok, nil
		}
		if a.inflight != nil {
			ch, gen := a.inflight, a.gen
			a.mu.Unlock()
			select {
			case <-ch:
			case <-ctx.Done():
				return "", ctx.Err()
			}
			a.mu.Lock()
			if a.gen != gen && a.lastErr != nil {
				err := a.lastErr
				a.mu.Unlock()
				return "", err
			}
			continue
		}
		if !kept && a.lastErr != nil && now.Before(a.retryAt) {
			err := a.lastErr
			a.mu.Unlock()
			return "", err
		}
		ch := make(chan struct{})
		a.inflight = ch
		a.mu.Unlock()
		tok, exp, err := a.mint(ctx, c, fp)
		a.mu.Lock()
		a.inflight = nil
		a.gen++
		close(ch)
		if err != nil {
			if ctx.Err() == nil { // a caller that gave up says nothing of the service
				a.lastErr, a.retryAt = err, a.now().Add(retryPause)
			}
			if kept && a.now().Before(a.exp.Add(-a.margin/2)) {
				tok := a.token
				a.mu.Unlock()
				return tok, nil
			}
			a.mu.Unlock()
			return "", err
		}
		if a.OnToken != nil {
			a.OnToken(tok)
		}
		a.token, a.exp, a.fp, a.mints, a.lastErr, a.retryAt = tok, exp, fp, a.mints+1, nil, time.Time{}
		a.margin = min(5*time.Minute, exp.Sub(a.now())/5)
		a.mu.Unlock()
		return tok, nil
	}
}

// retryPause is how long a failed mint is not tried again (the callers
// meanwhile get its error, or the kept token while it lasts).
const retryPause = 2 * time.Second

// fingerprint names credentials without holding the key.
func fingerprint(c Credentials) string {
	sum := sha256.Sum256([]byte(c.PrivateKey))
	return c.AppID + "/" + strconv.FormatInt(c.InstallationID, 10) + "/" + hex.EncodeToString(sum[:8])
}

// signer is the parsed key of these credentials (parsed again only when
// it changed).
func (a *App) signer(c Credentials, fp string) (*rsa.PrivateKey, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.key != nil && a.keyFP == fp {
		return a.key, nil
	}
	k, err := ParseKey(c.PrivateKey)
	if err != nil {
		return nil, err
	}
	a.key, a.keyFP = k, fp
	return k, nil
}

// maxAnswer bounds the token answer read.
const maxAnswer = 1 << 20

// mint is one POST /app/installations/{id}/access_tokens.
func (a *App) mint(ctx context.Context, c Credentials, fp string) (string, time.Time, error) {
	switch {
	case c.AppID == "":
		return "", time.Time{}, errors.New("the GitHub App's id is empty")
	case c.InstallationID <= 0:
		return "", time.Time{}, errors.New("the GitHub App's installation id is not a positive number")
	}
	key, err := a.signer(c, fp)
	if err != nil {
		return "", time.Time{}, err
	}
	jwt, err := JWT(c.AppID, key, a.now())
	if err != nil {
		return "", time.Time{}, fmt.Errorf("signing the GitHub App's JWT: %w", err)
	}
	u := fmt.Sprintf("%s/app/installations/%d/access_tokens", a.api, c.InstallationID)
	req, err := http.NewRequestWithContext(ctx, "POST", u, http.NoBody)
	if err != nil {
		return "", time.Time{}, forge.RedactError(err)
	}
	req.Header.Set("Authorization", "Bearer "+jwt)
	req.Header.Set("Accept", "application/vnd.github+json")
	req.Header.Set("X-GitHub-Api-Version", "2022-11-28")
	resp, err := a.hc.Do(req)
	if err != nil {
		return "", time.Time{}, fmt.Errorf("minting the GitHub App installation's token: %w", forge.RedactError(err))
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if resp.StatusCode != http.StatusCreated {
		var m struct {
			Message string `json:"message"`
		}
		json.Unmarshal(body, &m)
		return "", time.Time{}, fmt.Errorf("minting the GitHub App installation's token (app %s, installation %d): %w", c.AppID, c.InstallationID,
			forge.ResponseError(resp, m.Message))
	}
	var t struct {
		Token     string    `json:"token"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.NewDecoder(bytes.NewReader(body)).Decode(&t); err != nil || t.Token == "" || t.ExpiresAt.IsZero() {
		return "", time.Time{}, errors.New("minting the GitHub App installation's token: the answer holds no token or expires_at")
	}
	return t.Token, t.ExpiresAt, nil
}
