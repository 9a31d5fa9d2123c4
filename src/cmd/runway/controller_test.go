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
	"time"

	boshlog "github.com/cloudfoundry/bosh-utils/logger"
	"k8s.io/apimachinery/pkg/runtime"
	kubefake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

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
	e := engine{redact: redact, log: logging.Fields{Logger: logger}}
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

// A leader whose Lease is not renewed (its process was frozen, or the
// API server is away) stops acting as soon as its last renewal is older
// than the lease less leaseMargin — while it still believes it holds
// the Lease, before its own renewal deadline gives it up, and before
// another replica can take it.
func TestFenceHoldsWhileTheLeaseIsNotRenewed(t *testing.T) {
	kube := kubefake.NewClientset()
	var away atomic.Bool
	kube.PrependReactor("update", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
		if away.Load() {
			return true, nil, errors.New("the API server is away")
		}
		return false, nil, nil
	})
	started := make(chan struct{})
	var le *leaderelection.LeaderElector
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{LeaseMeta: metav1ObjectMeta("l", "ns"), Client: kube.CoordinationV1(),
			LockConfig: resourcelock.ResourceLockConfig{Identity: "a"}},
		// leaseMargin (3 s) before 4 s: acting ends 1 s after the last renewal.
		LeaseDuration: 4 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: 200 * time.Millisecond,
		Callbacks: leaderelection.LeaderCallbacks{OnStartedLeading: func(ctx context.Context) { close(started); <-ctx.Done() },
			OnStoppedLeading: func() {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go le.Run(ctx)
	<-started
	if err := fence(le); err != nil {
		t.Fatalf("leading: %v", err)
	}
	away.Store(true)
	for end := time.Now().Add(3 * time.Second); fence(le) == nil; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("still acting 3 s after the last renewal")
		}
	}
	if err := fence(le); !le.IsLeader() || !strings.Contains(err.Error(), "last renewed over") {
		t.Errorf("fenced while the elector still leads: IsLeader %v, %v", le.IsLeader(), err)
	}
}
