package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	boshlog "github.com/cloudfoundry/bosh-utils/logger"

	"github.com/runway-cpi/runway/src/controller"
	"github.com/runway-cpi/runway/src/logging"
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
		e := engine{redact: redact, log: logging.Fields{Logger: logger}}
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
