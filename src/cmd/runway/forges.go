package main

import (
	"fmt"
	"net/http"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/forgejo"
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
		tr.AuthFunc = func() string { return "Bearer " + tokenOf() }
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
