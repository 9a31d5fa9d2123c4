package forgetest

// GitHub Apps on the contract server, as GitHub's documentation
// describes them ("Generating a JSON Web Token (JWT) for a GitHub App",
// "Generating an installation access token"): an App's JWT (RS256,
// signed with the App's private key; iss the App's id or client id, iat
// and exp no more than 10 minutes apart) exchanged at POST
// /app/installations/{id}/access_tokens (201) for an installation token
// that lasts an hour (SetInstallationTokenTTL) and is then refused (401
// Bad credentials). The enterprise REST endpoints take no installation
// token (403: "You cannot authenticate using a GitHub App for runners at
// the enterprise level").

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// appService is the Apps' state (under GitHub.mu).
type appService struct {
	keys          map[string]*rsa.PublicKey // App id → its key
	installations map[int64]string          // installation → its App
	tokens        map[string]time.Time      // installation token → expiry
	ttl           time.Duration
	stats         AppStats
}

// AppStats count what the App endpoints saw.
type AppStats struct {
	// Minted: installation tokens made. Refused: JWTs refused (a wrong
	// key or a bad claim). ExpiredUses: requests with an installation
	// token past its expiry.
	Minted, Refused, ExpiredUses int
}

func newAppService() appService {
	return appService{keys: map[string]*rsa.PublicKey{}, installations: map[int64]string{}, tokens: map[string]time.Time{},
		ttl: time.Hour}
}

// AddApp registers an App (its public key) and one installation of it.
func (g *GitHub) AddApp(appID string, key *rsa.PublicKey, installation int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.apps.keys[appID] = key
	g.apps.installations[installation] = appID
}

// SetInstallationTokenTTL sets how long an installation token lasts (an
// hour unless set).
func (g *GitHub) SetInstallationTokenTTL(d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.apps.ttl = d
}

// AppStats reports what the App endpoints saw.
func (g *GitHub) AppStats() AppStats {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.apps.stats
}

// InstallationTokens lists the installation tokens minted (tests look for
// them where they must not be).
func (g *GitHub) InstallationTokens() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for t := range g.apps.tokens {
		out = append(out, t)
	}
	return out
}

// restAuth checks a REST request's credential: the API token, or an
// installation token not expired (never on an enterprise's endpoints).
// 0: accepted.
func (g *GitHub) restAuth(r *http.Request) (int, string) {
	auth := r.Header.Get("Authorization")
	if auth == "Bearer "+g.APIToken {
		return 0, ""
	}
	tok, ok := strings.CutPrefix(auth, "Bearer ")
	if !ok {
		tok, ok = strings.CutPrefix(auth, "token ")
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	exp, known := g.apps.tokens[tok]
	switch {
	case !ok || !known:
		return 401, "Bad credentials"
	case !time.Now().Before(exp):
		g.apps.stats.ExpiredUses++
		return 401, "Bad credentials"
	case strings.HasPrefix(r.URL.Path, "/enterprises/"):
		return 403, "Resource not accessible by integration"
	}
	return 0, ""
}

// installationToken is POST /app/installations/{id}/access_tokens with an
// App's JWT.
func (g *GitHub) installationToken(w http.ResponseWriter, r *http.Request) {
	p := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if len(p) != 4 || p[3] != "access_tokens" || r.Method != "POST" {
		writeJSON(w, 404, map[string]string{"message": "Not Found"})
		return
	}
	id, _ := strconv.ParseInt(p[2], 10, 64)
	jwt, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	g.mu.Lock()
	defer g.mu.Unlock()
	app, msg := g.verifyJWT(jwt)
	if msg != "" {
		g.apps.stats.Refused++
		writeJSON(w, 401, map[string]string{"message": msg,
			"documentation_url": "https://docs.github.com/rest/apps/apps#create-an-installation-access-token-for-an-app"})
		return
	}
	if g.apps.installations[id] != app {
		writeJSON(w, 404, map[string]string{"message": "Not Found"})
		return
	}
	tok := "ghs_" + randHex(18)
	exp := time.Now().Add(g.apps.ttl)
	g.apps.tokens[tok] = exp
	g.apps.stats.Minted++
	writeJSON(w, 201, map[string]any{"token": tok, "expires_at": exp.UTC().Format(time.RFC3339),
		"permissions":          map[string]string{"organization_self_hosted_runners": "write", "administration": "write", "metadata": "read"},
		"repository_selection": "all"})
}

// verifyJWT checks an App's JWT: RS256, signed with the key of the App
// its iss names, iat not in the future (60 s of drift allowed), exp
// after now and no more than 10 minutes after iat. It answers the App,
// or GitHub's message refusing it. The caller holds g.mu.
func (g *GitHub) verifyJWT(jwt string) (string, string) {
	const undecodable = "A JSON web token could not be decoded"
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		return "", undecodable
	}
	dec := base64.RawURLEncoding
	head, err1 := dec.DecodeString(parts[0])
	body, err2 := dec.DecodeString(parts[1])
	sig, err3 := dec.DecodeString(parts[2])
	var h struct {
		Alg string `json:"alg"`
	}
	var c struct {
		Iss      json.RawMessage `json:"iss"`
		Iat, Exp int64
	}
	if err1 != nil || err2 != nil || err3 != nil || json.Unmarshal(head, &h) != nil || json.Unmarshal(body, &c) != nil || h.Alg != "RS256" {
		return "", undecodable
	}
	iss := strings.Trim(string(c.Iss), `"`)
	key := g.apps.keys[iss]
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if key == nil || rsa.VerifyPKCS1v15(key, crypto.SHA256, sum[:], sig) != nil {
		return "", undecodable
	}
	now := time.Now().Unix()
	switch {
	case c.Iat == 0 || c.Iat > now+60:
		return "", "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued."
	case c.Exp <= now:
		return "", "'Expiration time' claim ('exp') must be a numeric value representing the future time at which the assertion expires."
	case c.Exp-c.Iat > 600 || c.Exp > now+600+60:
		return "", "'Expiration time' claim ('exp') is too far in the future."
	}
	return iss, ""
}
