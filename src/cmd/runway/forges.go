package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/forgejo"
	"github.com/runway-cpi/runway/src/forge/ghapp"
	"github.com/runway-cpi/runway/src/forge/gitea"
	"github.com/runway-cpi/runway/src/forge/github"
	"github.com/runway-cpi/runway/src/forge/scaleset"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/secret"
)

// forges builds each configured forge's client over one transport that
// reads its token (re-read when its file changes) and reports to m, and
// reads its webhook secret. The orchestrator gets them built: it knows
// forge.Client, not which library speaks to which forge.
func forges(cfg *config.Config, m *orchestrator.Metrics, redact *logging.Redactor, log logging.Fields) (map[string]orchestrator.Forge, error) {
	out := map[string]orchestrator.Forge{}
	for _, fc := range cfg.Forges {
		f, err := buildForge(fc, m, redact, log)
		if err != nil {
			return nil, err
		}
		out[fc.Name] = f
	}
	return out, nil
}

// buildForge builds one forge's client. Its token and webhook secret come
// from its file or variable (read again when the file changes), or from
// memory (fc.Secrets, kept current by the Kubernetes controller).
func buildForge(fc config.ForgeConfig, m *orchestrator.Metrics, redact *logging.Redactor, log logging.Fields) (orchestrator.Forge, error) {
	tokenOf, hookOf := func() string { return "" }, func() string { return "" }
	if fc.Secrets != nil {
		tokenOf, hookOf = fc.Secrets.Token, fc.Secrets.WebhookSecret
	} else {
		token, err := secret.New(fc.TokenFile, fc.TokenEnv, "forge "+fc.Name+" token", redact, log)
		if err != nil {
			return orchestrator.Forge{}, err
		}
		hook, err := secret.New(fc.WebhookSecretFile, fc.WebhookSecretEnv, "forge "+fc.Name+" webhook secret", redact, log)
		if err != nil {
			return orchestrator.Forge{}, err
		}
		tokenOf, hookOf = token.Get, hook.Get
	}
	tr := forge.NewTransport(nil)
	if fc.Guard != nil {
		tr.Base = &forge.ETagCache{Base: forge.GuardedTransport(fc.Guard.Check)}
	}
	budget := &forge.RateBudget{}
	tr.Observe = func(method string, status int, h http.Header) { budget.Observe(h) }
	if m != nil {
		metric := m.ObserveForge(fc.Name)
		tr.Observe = func(method string, status int, h http.Header) {
			metric(method, status, h)
			budget.Observe(h)
		}
	}
	f := orchestrator.Forge{Secret: hookOf, Budget: budget}
	switch fc.Type {
	case "gitea":
		tr.AuthFunc = func() string { return "token " + tokenOf() }
		f.Client = gitea.New(fc.URL, tr)
	case "forgejo":
		tr.AuthFunc = func() string { return "token " + tokenOf() }
		f.Client = forgejo.New(fc.URL, tr)
	case "github":
		cred, err := gitHubCredential(fc, tokenOf, tr.Observe, redact, log)
		if err != nil {
			return orchestrator.Forge{}, err
		}
		tr.Cred = cred
		tr.Headers = map[string]string{"X-GitHub-Api-Version": "2022-11-28"}
		c, err := github.New(fc.URL, tr)
		if err != nil {
			return orchestrator.Forge{}, fmt.Errorf("forge %s: %w", fc.Name, err)
		}
		c.RunnerGroupID = fc.RunnerGroupID
		f.Client = c
		f.ScaleSets = func(s forge.Scope) (*scaleset.Client, error) {
			// The Actions service: its own credentials per request (the
			// admin and session tokens), the forge's metrics.
			actions := forge.NewTransport(nil)
			actions.Observe = tr.Observe
			return scaleset.New(scaleset.Config{APIURL: fc.URL, ConfigURL: scaleset.ConfigURL(fc.RunnerURL, s), Scope: s,
				REST: tr, Actions: actions})
		}
	default:
		return orchestrator.Forge{}, fmt.Errorf("forge %s: unknown type %q", fc.Name, fc.Type)
	}
	return f, nil
}

// gitHubAuth is a GitHub forge's credential, chosen at every request: an
// App installation's token (minted and kept by ghapp) while the forge's
// source holds an App, else its token.
type gitHubAuth struct {
	token func() string
	isApp func() bool
	app   *ghapp.App
}

// Authorization implements forge.Credential.
func (g gitHubAuth) Authorization(ctx context.Context) (string, error) {
	if g.isApp() {
		return g.app.Authorization(ctx)
	}
	return "Bearer " + g.token(), nil
}

// Refused implements forge.Credential.
func (g gitHubAuth) Refused(value string) { g.app.Refused(value) }

// gitHubCredential is a GitHub forge's credential: its token, or the App
// installation its config (app: id, installation_id, the key's file or
// variable) or its memory source (a Kubernetes Secret in ARC's
// githubConfigSecret form) names. Every key and token is added to redact.
func gitHubCredential(fc config.ForgeConfig, tokenOf func() string, observe func(string, int, http.Header),
	redact *logging.Redactor, log logging.Fields) (forge.Credential, error) {
	var creds func() (ghapp.Credentials, error)
	isApp := func() bool { return false }
	if fc.App.Set() {
		key, err := secret.New(fc.App.PrivateKeyFile, fc.App.PrivateKeyEnv, "forge "+fc.Name+" GitHub App private key", redact, log)
		if err != nil {
			return nil, err
		}
		if _, err := ghapp.ParseKey(key.Get()); err != nil {
			return nil, fmt.Errorf("forges: %s.app.private_key: %w", fc.Name, err)
		}
		isApp = func() bool { return true }
		creds = func() (ghapp.Credentials, error) {
			return ghapp.Credentials{AppID: fc.App.ID, InstallationID: fc.App.InstallationID, PrivateKey: key.Get()}, nil
		}
	} else if src, ok := fc.Secrets.(config.AppSource); ok {
		isApp = func() bool { id, _, _ := src.App(); return id != "" }
		creds = func() (ghapp.Credentials, error) {
			id, inst, key := src.App()
			return ghapp.Credentials{AppID: id, InstallationID: inst, PrivateKey: key}, nil
		}
	} else {
		creds = func() (ghapp.Credentials, error) { return ghapp.Credentials{}, errors.New("no GitHub App configured") }
	}
	mint := forge.NewTransport(nil)
	mint.Observe = observe
	var mu sync.Mutex
	seen := ""
	app := ghapp.New(fc.URL, mint, func() (ghapp.Credentials, error) {
		c, err := creds()
		mu.Lock()
		if c.PrivateKey != seen { // a new key: learnt once
			seen = c.PrivateKey
			redact.Add(pemLines(c.PrivateKey)...)
		}
		mu.Unlock()
		return c, err
	})
	app.OnToken = func(tok string) { redact.Add(tok) }
	return gitHubAuth{token: tokenOf, isApp: isApp, app: app}, nil
}

// pemLines are a PEM key's lines long enough to be worth redacting (a
// line of it, quoted alone, is secret too).
func pemLines(key string) []string {
	var out []string
	for _, l := range strings.Split(key, "\n") {
		if l = strings.TrimSpace(l); len(l) >= 16 && !strings.HasPrefix(l, "-----") {
			out = append(out, l)
		}
	}
	return append(out, strings.TrimSpace(key))
}
