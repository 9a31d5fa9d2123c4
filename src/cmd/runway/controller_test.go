package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"

	boshlog "github.com/cloudfoundry/bosh-utils/logger"

	"github.com/runway-cpi/runway/src/controller"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator"
	"github.com/runway-cpi/runway/src/orchestrator/config"
)

type memSecrets string

func (m memSecrets) Token() string         { return string(m) }
func (m memSecrets) WebhookSecret() string { return "" }

// A group's forge URL aimed at an address inside the cluster (here a
// stand-in answering as the API server does): what it answers reaches
// the log, never the group's status (the controller writes Check's
// error there); the status keeps the request and its HTTP status, and
// a refused token is still told apart.
func TestCheckSaysNothingTheAddressAnswered(t *testing.T) {
	const marker = "secret-from-the-api-server-91c2"
	for _, status := range []int{http.StatusForbidden, http.StatusUnauthorized, http.StatusNotFound} {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"kind":"Status","message":"%s: required=[write:organization]"}`, marker)
		}))
		logger, redact := logging.New(boshlog.LevelError, &strings.Builder{})
		e := checkEngine(redact, logging.Fields{Logger: logger})
		fc := config.ForgeConfig{Name: "f", Type: "gitea", URL: srv.URL, Secrets: memSecrets("tok-0123456789")}
		gc := config.GroupConfig{Name: "g", Forge: "f", Scope: "org", Org: "acme", Labels: []string{"linux"}}
		err := e.Check(context.Background(), fc, gc)
		srv.Close()
		if err == nil || strings.Contains(err.Error(), marker) || !strings.Contains(err.Error(), fmt.Sprintf("HTTP %d", status)) {
			t.Errorf("HTTP %d: Check said %v", status, err)
		}
		if status == http.StatusForbidden && !errors.Is(err, controller.ErrTokenScope) {
			t.Errorf("HTTP 403 with a scope: %v, want ErrTokenScope", err)
		}
	}
}

// A forge handed over with the controller's guard: its connections are
// checked at connect, after the name resolved (so a name that resolves
// to a refused address later, or a redirect, gets nowhere). Here the
// forge is on loopback: nothing reaches it, and the error says why.
func TestForgeConnectionsAreGuarded(t *testing.T) {
	var asked atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { asked.Add(1) }))
	defer srv.Close()
	f := &controllerFlags{}
	pol, err := addressPolicy(f, "https://10.96.0.1:443", []string{"HOST_IPS=10.99.0.2", "KUBERNETES_PORT_443_TCP_ADDR=10.96.0.9"})
	if err != nil {
		t.Fatal(err)
	}
	for addr, what := range map[string]string{"10.96.0.1": "API server", "10.96.0.9": "API server", "10.99.0.2": "node",
		"127.0.0.1": "loopback", "169.254.169.254": "link-local"} {
		if err := pol.Check(netip.MustParseAddr(addr)); err == nil || !strings.Contains(err.Error(), what) {
			t.Errorf("%s: %v, want refused as %s", addr, err, what)
		}
	}
	logger, redact := logging.New(boshlog.LevelError, &strings.Builder{})
	e := checkEngine(redact, logging.Fields{Logger: logger})
	fc := config.ForgeConfig{Name: "f", Type: "gitea", URL: srv.URL, Secrets: memSecrets("tok-0123456789"), Guard: pol}
	gc := config.GroupConfig{Name: "g", Forge: "f", Scope: "org", Org: "acme", Labels: []string{"linux"}}
	err = e.Check(context.Background(), fc, gc)
	if err == nil || !strings.Contains(err.Error(), "loopback") || asked.Load() != 0 {
		t.Errorf("Check: %v; %d requests reached the forge on loopback", err, asked.Load())
	}
	f.forgeAllow = "127.0.0.0/8"
	if fc.Guard, err = addressPolicy(f, "https://10.96.0.1:443", nil); err != nil {
		t.Fatal(err)
	}
	if e.Check(context.Background(), fc, gc); asked.Load() == 0 {
		t.Error("allowed by -forge-allow, the forge was not reached")
	}
}

// checkEngine is the controller's engine as `runway controller` makes
// it, for Check alone (no orchestrator).
func checkEngine(redact *logging.Redactor, log logging.Fields) controller.Engine {
	return controller.NewEngine(nil, func(fc config.ForgeConfig) (orchestrator.Forge, error) { return buildForge(fc, nil, redact, log) },
		redact, log)
}
