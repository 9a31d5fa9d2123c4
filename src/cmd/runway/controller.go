package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/runway-cpi/runway/src/controller"
	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/orchestrator"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/orchestrator/httpapi"
)

// seedDefaultLabels are act_runner's documented defaults (Gitea's docs,
// "Labels"), which seed 001 adds to every group's ("ubuntu-latest:
// docker://node:16-bullseye, ubuntu-22.04:..., etc.").
var seedDefaultLabels = []string{"ubuntu-latest:docker://node:16-bullseye", "ubuntu-22.04:docker://node:16-bullseye",
	"ubuntu-20.04:docker://node:16-bullseye", "ubuntu-18.04:docker://node:16-buster"}

// controllerFlags are `runway controller`'s flags.
type controllerFlags struct {
	cfgPath, kubeconfig, namespace      string
	leaderElect                         bool
	leaseName, leaseNamespace, identity string
	seedImage, seedCommand, seedArgs    string
	seedLabels                          string
	seedPoll                            time.Duration
	secretNames                         string
	secretsByLabel                      bool
	forgeAllow, forgeDeny               string
}

func parseControllerFlags(args []string) (*controllerFlags, error) {
	f := &controllerFlags{}
	fs := flag.NewFlagSet("controller", flag.ContinueOnError)
	fs.StringVar(&f.cfgPath, "config", "runway.yml", "the daemon's config (YAML; forges and groups come from resources)")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig (default: the pod's service account)")
	fs.StringVar(&f.namespace, "namespace", "", "namespaces whose resources are watched, comma-separated (default: every namespace)")
	fs.StringVar(&f.secretNames, "secret-names", "", "the Secrets of those namespaces the resources may name, comma-separated (no other is read)")
	fs.StringVar(&f.forgeAllow, "forge-allow", "", "addresses (CIDRs) forge URLs may reach though denied, comma-separated")
	fs.StringVar(&f.forgeDeny, "forge-deny", "", "more addresses (CIDRs: the nodes' network) forge URLs may not reach, comma-separated")
	fs.BoolVar(&f.secretsByLabel, "secrets-by-label", false, "also read the Secrets labelled "+controller.SecretLabel+"=true (the Role must let it list Secrets)")
	fs.BoolVar(&f.leaderElect, "leader-elect", true, "act only while holding the Lease (replicas)")
	fs.StringVar(&f.leaseName, "lease-name", "runway-controller", "the Lease's name")
	fs.StringVar(&f.leaseNamespace, "lease-namespace", "", "the Lease's namespace (default: the pod's)")
	host, _ := os.Hostname()
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	// The pod's name and this process's own suffix: a leader's container
	// killed and restarted is another candidate, not the holder.
	fs.StringVar(&f.identity, "identity", host+"_"+hex.EncodeToString(suffix), "this replica's name in the Lease")
	fs.StringVar(&f.seedImage, "seed-image", "gitea/act_runner:nightly-dind-rootless", "the runner image of seed 001's RunnerGroups")
	fs.StringVar(&f.seedCommand, "seed-command", "/usr/bin/supervisord", "what their runner pods run (the bootstrap execs it)")
	fs.StringVar(&f.seedArgs, "seed-args", "-c,/etc/supervisord.conf", "its arguments, comma-separated")
	fs.StringVar(&f.seedLabels, "seed-default-labels", strings.Join(seedDefaultLabels, ","),
		"labels added to every seed RunnerGroup's, comma-separated, unless it has one of the same name (seed 001's defaults)")
	fs.DurationVar(&f.seedPoll, "seed-poll-interval", 10*time.Second, "how often their Gitea queues are read (they have no webhook)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	for _, l := range splitList(f.seedLabels) {
		if err := forge.ParseLabel(l).Check("gitea"); err != nil {
			return nil, fmt.Errorf("-seed-default-labels: %q cannot be registered as written: %w", l, err)
		}
	}
	if f.leaseNamespace == "" {
		b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
		f.leaseNamespace = strings.TrimSpace(string(b))
		if err != nil || f.leaseNamespace == "" {
			f.leaseNamespace, _, _ = strings.Cut(f.namespace, ",")
		}
	}
	return f, nil
}

// controllerCmd runs the engine with its groups from Kubernetes
// resources: `runway controller`, the chart's Deployment.
func controllerCmd(args []string) error {
	f, err := parseControllerFlags(args)
	if err != nil {
		return err
	}
	cfg, err := config.LoadControllerConfig(f.cfgPath)
	if err != nil {
		return err
	}
	logger, redact, log, err := daemonLogging(cfg.LogLevel)
	if err != nil {
		return err
	}
	rc, err := restConfig(f.kubeconfig)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	addrs, err := addressPolicy(f, rc.Host, os.Environ())
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	metrics := orchestrator.NewMetrics()
	var active atomic.Pointer[http.Handler]
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	served := make(chan error, 1)
	go func() { served <- httpapi.Serve(ctx, cfg.HTTP, ln, standbyHandler(&active), metrics); stop() }()
	run := func(ctx context.Context, fence func() error) error {
		return runController(ctx, cfg, f, kube, dyn, addrs, fence, metrics, &active, logger, redact)
	}
	// The webhook Service selects the leader by a label on its pod: a
	// replica starting (a restarted leader's container keeps its pod's
	// labels) is not the leader until it says so.
	controller.MarkLeader(ctx, kube, f.leaseNamespace, os.Getenv("POD_NAME"), log, false)
	if !f.leaderElect {
		err = run(ctx, nil)
	} else {
		err = controller.LeadThenRun(ctx, kube, controller.Lease{Name: f.leaseName, Namespace: f.leaseNamespace, Identity: f.identity}, log, run)
	}
	stop()
	if serr := <-served; serr != nil && !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = fmt.Errorf("http server: %w", serr)
	}
	return err
}

// runController is the leader's work: the engine, its HTTP interface and
// the controller feeding it.
func runController(ctx context.Context, cfg *config.Config, f *controllerFlags, kube kubernetes.Interface, dyn dynamic.Interface,
	addrs *controller.AddressPolicy, fence func() error, metrics *orchestrator.Metrics, active *atomic.Pointer[http.Handler], logger logging.Logger, redact *logging.Redactor) error {
	olog := logging.Fields{Logger: logger, Tag: "orchestrator"}
	var ctl atomic.Pointer[controller.Controller]
	// Holding the Lease, this replica is the one to act: another's
	// leadership sessions are stale (TakeOver), and every side effect
	// waits on the fence.
	o, err := orchestrator.New(cfg, orchestrator.Options{Logger: logger, Redactor: redact, Metrics: metrics, Fence: fence,
		TakeOver: fence != nil,
		NewForge: func(fc config.ForgeConfig) (orchestrator.Forge, error) { return buildForge(fc, metrics, redact, olog) },
		Events: func(ev orchestrator.RunnerEvent) {
			if c := ctl.Load(); c != nil {
				c.RunnerEvent(ev.Group, ev.Runner, ev.Type, ev.Message)
			}
		}})
	if err != nil {
		return err
	}
	defer o.Close()
	h, err := httpapi.Handler(o, cfg, olog, redact, nil)
	if err != nil {
		return err
	}
	active.Store(&h)
	defer active.Store(nil)
	var args []string
	if f.seedArgs != "" {
		args = strings.Split(f.seedArgs, ",")
	}
	c := controller.New(controller.Options{Kube: kube, Dyn: dyn, Namespaces: splitList(f.namespace),
		Secrets: controller.SecretAccess{Names: splitList(f.secretNames), ByLabel: f.secretsByLabel}, Addresses: addrs, Fence: fence,
		Engine: controller.NewEngine(o, func(fc config.ForgeConfig) (orchestrator.Forge, error) { return buildForge(fc, nil, redact, olog) },
			redact, olog),
		Seed: controller.Seed{Image: f.seedImage, Command: f.seedCommand, Args: args, PollInterval: f.seedPoll,
			DefaultLabels: splitList(f.seedLabels)},
		Log: logging.Fields{Logger: logger, Tag: "controller"}, Redactor: redact})
	ctl.Store(c)
	controller.MarkLeader(ctx, kube, f.leaseNamespace, os.Getenv("POD_NAME"), logging.Fields{Logger: logger, Tag: "runway"}, true)
	done := make(chan error, 1)
	go func() { done <- o.Run(ctx) }()
	err = c.Run(ctx)
	<-done
	return err
}

// standbyHandler answers for the engine once this replica leads; until
// then /healthz and /readyz are 200 (alive, and ready to lead) and
// everything else 503 (the webhook Service selects the leader's pod by
// its label, so deliveries reach the leader only).
func standbyHandler(active *atomic.Pointer[http.Handler]) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := active.Load()
		switch {
		case r.URL.Path == "/readyz" && h != nil:
			fmt.Fprintln(w, "leading")
		case r.URL.Path == "/readyz":
			fmt.Fprintln(w, "standing by")
		case h != nil:
			(*h).ServeHTTP(w, r)
		case r.URL.Path == "/healthz":
			fmt.Fprintln(w, "standing by")
		default:
			http.Error(w, "standing by: another replica leads", http.StatusServiceUnavailable)
		}
	})
}

func restConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		return clientcmd.BuildConfigFromFlags("", kubeconfig)
	}
	return rest.InClusterConfig()
}

// splitList splits a comma-separated flag, dropping empty items.
func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}
