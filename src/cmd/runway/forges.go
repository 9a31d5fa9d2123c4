package main

import (
	"fmt"
	"net/http"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/forgejo"
	"github.com/runway-cpi/runway/src/forge/gitea"
	"github.com/runway-cpi/runway/src/forge/github"
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
		token, err := secret.New(fc.TokenFile, fc.TokenEnv, "forge "+fc.Name+" token", redact, log)
		if err != nil {
			return nil, err
		}
		hook, err := secret.New(fc.WebhookSecretFile, fc.WebhookSecretEnv, "forge "+fc.Name+" webhook secret", redact, log)
		if err != nil {
			return nil, err
		}
		tr := forge.NewTransport(nil)
		budget := &forge.RateBudget{}
		tr.Observe = func(method string, status int, h http.Header) { budget.Observe(h) }
		if m != nil {
			metric := m.ObserveForge(fc.Name)
			tr.Observe = func(method string, status int, h http.Header) {
				metric(method, status, h)
				budget.Observe(h)
			}
		}
		f := orchestrator.Forge{Secret: hook.Get, Budget: budget}
		switch fc.Type {
		case "gitea":
			tr.AuthFunc = func() string { return "token " + token.Get() }
			f.Client = gitea.New(fc.URL, tr)
		case "forgejo":
			tr.AuthFunc = func() string { return "token " + token.Get() }
			f.Client = forgejo.New(fc.URL, tr)
		case "github":
			tr.AuthFunc = func() string { return "Bearer " + token.Get() }
			tr.Headers = map[string]string{"X-GitHub-Api-Version": "2022-11-28"}
			c, err := github.New(fc.URL, tr)
			if err != nil {
				return nil, fmt.Errorf("forge %s: %w", fc.Name, err)
			}
			c.RunnerGroupID = fc.RunnerGroupID
			f.Client = c
		default:
			return nil, fmt.Errorf("forge %s: unknown type %q", fc.Name, fc.Type)
		}
		out[fc.Name] = f
	}
	return out, nil
}
