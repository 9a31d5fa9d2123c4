package controller

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	giteav1 "github.com/runway-cpi/runway/src/controller/apis/gitea/v1alpha1"
	runwayv1 "github.com/runway-cpi/runway/src/controller/apis/runway/v1alpha1"
	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/ghapp"
	"github.com/runway-cpi/runway/src/orchestrator/config"
)

// The kinds the controller reads.
const (
	kindSeed  = "RunnerGroup.gitea.bpg.pw"
	kindForge = "Forge.runway.io"
	kindGroup = "RunnerGroup.runway.io"
)

// Reasons of the Ready condition when it is False.
const (
	ReasonReady             = "Ready"
	ReasonSecretMissing     = "SecretMissing"
	ReasonSecretNotAllowed  = "SecretNotAllowed"
	ReasonForgeMissing      = "ForgeMissing"
	ReasonForgeUnreachable  = "ForgeUnreachable"
	ReasonTokenScopeMissing = "TokenScopeMissing"
	ReasonInvalid           = "Invalid"
	ReasonDeleting          = "Deleting"
	ReasonNotTakingJobs     = "RunnersNotTakingJobs"
	// ReasonForgeAddressRefused: the forge URL's host is an address
	// Runway sends no token to (AddressPolicy).
	ReasonForgeAddressRefused = "ForgeAddressRefused"
)

// notReady is why an object cannot be handed to the engine (yet).
type notReady struct{ reason, msg string }

func (n *notReady) Error() string { return n.reason + ": " + n.msg }

var unsafeName = regexp.MustCompile(`[^a-z0-9-]+`)

// engineName is an object's name in the engine (a group's runners are
// named after it): readable, and unique per kind, namespace and name —
// the engine's names are one flat space of at most 39 characters.
func engineName(kind, ns, name string) string {
	h := sha256.Sum256([]byte(kind + "/" + ns + "/" + name))
	base := strings.Trim(unsafeName.ReplaceAllString(strings.ToLower(name), "-"), "-")
	if len(base) > 24 {
		base = strings.TrimRight(base[:24], "-")
	}
	if base == "" {
		base = "g"
	}
	return base + "-" + hex.EncodeToString(h[:3])
}

// secretSource is one forge's token (or GitHub App) and webhook secret,
// read from its Secrets: the engine asks for them at every use, so a
// rotation is picked up without another call. A Secret that goes away
// keeps the last value (a retiring group still needs its token).
type secretSource struct {
	mu          sync.Mutex
	token, hook string
	app         appCreds
}

// appCreds are a GitHub App installation's credentials (no id: none).
type appCreds struct {
	id           string
	installation int64
	key          string
}

func (s *secretSource) Token() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.token
}

func (s *secretSource) WebhookSecret() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hook
}

// App implements config.AppSource.
func (s *secretSource) App() (string, int64, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.app.id, s.app.installation, s.app.key
}

func (s *secretSource) set(token, hook string, app appCreds) {
	s.mu.Lock()
	s.token, s.hook, s.app = token, hook, app
	s.mu.Unlock()
}

// secretReader answers a key of a Secret of the object's namespace for
// one of its fields, or why not (a *notReady).
type secretReader func(ns, field, name, key string) (string, error)

// Seed holds what seed 001's groups run, which its resource does not say:
// the runner's image (the seed's own by default), command and arguments,
// its pod's cloud properties, the poll interval, and the default labels
// the seed adds to every group's.
type Seed struct {
	Image           string
	Command         string
	Args            []string
	CloudProperties map[string]any
	PollInterval    time.Duration
	DefaultLabels   []string
}

// effectiveLabels are seed 001's: the group's labels, then each default
// whose name none of them has ("unless explicitly overridden":
// ubuntu-latest:host in the group's replaces the default
// ubuntu-latest:docker://…).
func effectiveLabels(labels, defaults []string) []string {
	out := slices.Clone(labels)
	names := forge.LabelNames(labels)
	for _, d := range defaults {
		if n := forge.ParseLabel(d).Name; !slices.Contains(names, n) {
			out = append(out, d)
			names = append(names, n)
		}
	}
	return out
}

// seedGroup turns a seed RunnerGroup into a forge and a group.
func seedGroup(rg *giteav1.RunnerGroup, seed Seed, read secretReader) (config.ForgeConfig, config.GroupConfig, string, string, error) {
	name := engineName(kindSeed, rg.Namespace, rg.Name)
	s := rg.Spec
	an, ak := s.AuthToken.Ref()
	token, err := read(rg.Namespace, "spec.authToken", an, ak)
	if err != nil {
		return config.ForgeConfig{}, config.GroupConfig{}, "", "", err
	}
	rn, rk := s.RegistrationToken.Ref()
	if _, err := read(rg.Namespace, "spec.registrationToken", rn, rk); err != nil {
		return config.ForgeConfig{}, config.GroupConfig{}, "", "", err
	}
	labels := effectiveLabels(s.Labels, seed.DefaultLabels)
	if len(labels) == 0 {
		return config.ForgeConfig{}, config.GroupConfig{}, "", "", &notReady{ReasonInvalid,
			"spec.labels: none, and no default labels are set (the chart's seed.defaultLabels): name at least one"}
	}
	fc := config.ForgeConfig{Name: name, Type: "gitea", URL: s.URL(), PollInterval: config.Duration{Duration: seed.PollInterval}}
	gc := config.GroupConfig{Name: name, Forge: name, Scope: s.Scope, Org: s.Org, User: s.User, Labels: labels,
		MaxActiveRunners: int(s.MaxActiveRunners), Stemcell: config.StemcellConfig{CloudProperties: map[string]any{"image": seed.Image}},
		CloudProperties: cloneMap(seed.CloudProperties), Runner: config.RunnerConfig{Command: seed.Command, Args: seed.Args}}
	switch {
	case s.Scope != "repo":
	case strings.Contains(s.Repo, "/"):
		gc.Repo = s.Repo
	case s.User != "": // gitea-runner-operator: the user before the org
		gc.Repo = s.User + "/" + s.Repo
	default:
		gc.Repo = s.Org + "/" + s.Repo
	}
	if s.Scope == "repo" {
		gc.Org, gc.User = "", ""
	}
	return fc, gc, token, "", nil
}

// forgeSecrets are what a Forge's Secrets hold for the engine.
type forgeSecrets struct {
	token, hook string
	app         appCreds
}

// runwayForge turns a Forge into a forge.
func runwayForge(f *runwayv1.Forge, read secretReader) (config.ForgeConfig, forgeSecrets, error) {
	s := f.Spec
	var sec forgeSecrets
	var err error
	switch {
	case s.GitHubConfigSecret != "":
		sec.token, sec.app, err = githubConfigSecret(read, f.Namespace, s.GitHubConfigSecret)
	case s.Token != nil:
		sec.token, err = read(f.Namespace, "spec.token", s.Token.Name, s.Token.Key)
	default:
		err = &notReady{ReasonInvalid, "spec.token: set exactly one of token or githubConfigSecret"}
	}
	if err != nil {
		return config.ForgeConfig{}, sec, err
	}
	if s.WebhookSecret != nil {
		if sec.hook, err = read(f.Namespace, "spec.webhookSecret", s.WebhookSecret.Name, s.WebhookSecret.Key); err != nil {
			return config.ForgeConfig{}, sec, err
		}
	}
	fc := config.ForgeConfig{Name: engineName(kindForge, f.Namespace, f.Name), Type: s.Type, URL: s.URL, RunnerURL: s.RunnerURL,
		RunnerGroupID: s.RunnerGroupID}
	if fc.PollInterval, err = duration("spec.pollInterval", s.PollInterval); err != nil {
		return config.ForgeConfig{}, sec, err
	}
	return fc, sec, nil
}

// githubConfigSecret reads a Secret in actions-runner-controller's
// githubConfigSecret form: github_token, or github_app_id,
// github_app_installation_id and github_app_private_key (never both).
// Its errors name the key, never a value.
func githubConfigSecret(read secretReader, ns, name string) (string, appCreds, error) {
	field := "spec.githubConfigSecret"
	tok, tokErr := read(ns, field, name, "github_token")
	id, idErr := read(ns, field, name, "github_app_id")
	for _, err := range []error{tokErr, idErr} {
		if nr, ok := err.(*notReady); ok && nr.reason != ReasonSecretMissing {
			return "", appCreds{}, err // not a Secret Runway may read: said as such
		}
	}
	switch {
	case tokErr == nil && idErr == nil:
		return "", appCreds{}, &notReady{ReasonInvalid, fmt.Sprintf("%s: Secret %s/%s holds both github_token and github_app_id: keep one", field, ns, name)}
	case tokErr == nil:
		return tok, appCreds{}, nil
	case idErr != nil:
		return "", appCreds{}, &notReady{ReasonSecretMissing, fmt.Sprintf("%s: Secret %s/%s has neither github_token nor github_app_id (or does not exist, or they are empty)", field, ns, name)}
	}
	instText, err := read(ns, field, name, "github_app_installation_id")
	if err != nil {
		return "", appCreds{}, err
	}
	inst, perr := strconv.ParseInt(instText, 10, 64)
	if perr != nil || inst <= 0 {
		return "", appCreds{}, &notReady{ReasonInvalid, fmt.Sprintf("%s: Secret %s/%s key github_app_installation_id is not a positive number", field, ns, name)}
	}
	key, err := read(ns, field, name, "github_app_private_key")
	if err != nil {
		return "", appCreds{}, err
	}
	if _, err := ghapp.ParseKey(key); err != nil {
		return "", appCreds{}, &notReady{ReasonInvalid, fmt.Sprintf("%s: Secret %s/%s key github_app_private_key: %v", field, ns, name, err)}
	}
	return "", appCreds{id: id, installation: inst, key: key}, nil
}

// runwayGroup turns a Runway RunnerGroup into a group of forge.
func runwayGroup(rg *runwayv1.RunnerGroup, forge string) (config.GroupConfig, error) {
	s := rg.Spec
	gc := config.GroupConfig{Name: engineName(kindGroup, rg.Namespace, rg.Name), Forge: forge, Scope: s.Scope, Org: s.Org,
		User: s.User, Repo: s.Repo, Enterprise: s.Enterprise, Labels: s.Labels, MaxActiveRunners: int(s.MaxActiveRunners), MinIdle: int(s.MinIdle),
		Priority: int(s.Priority), SpawnConcurrency: int(s.SpawnConcurrency), Demand: s.Demand,
		Runner: config.RunnerConfig{Command: s.Runner.Command, Args: s.Runner.Args, Env: s.Runner.Env}}
	if s.Demand == config.DemandScaleSet {
		gc.ScaleSet.Name = rg.Name // the engine's group name carries the namespace: the object's own reads better
		if s.ScaleSet != nil {
			gc.ScaleSet.Name = cmp.Or(s.ScaleSet.Name, rg.Name)
			gc.ScaleSet.RunnerGroupID = s.ScaleSet.RunnerGroupID
		}
	}
	if s.Image != "" {
		gc.Stemcell.CloudProperties = map[string]any{"image": s.Image}
	}
	gc.Stemcell.CID = s.StemcellCID
	if s.CloudProperties != nil && len(s.CloudProperties.Raw) > 0 {
		if err := json.Unmarshal(s.CloudProperties.Raw, &gc.CloudProperties); err != nil {
			return gc, &notReady{ReasonInvalid, "spec.cloudProperties: " + err.Error()}
		}
	}
	var err error
	for _, d := range []struct {
		field, v string
		to       *config.Duration
	}{{"spec.pollInterval", s.PollInterval, &gc.PollInterval}, {"spec.timeouts.spawn", s.Timeouts.Spawn, &gc.Timeouts.Spawn},
		{"spec.timeouts.idle", s.Timeouts.Idle, &gc.Timeouts.Idle}, {"spec.timeouts.maxLifetime", s.Timeouts.MaxLifetime, &gc.Timeouts.MaxLifetime},
		{"spec.timeouts.pickup", s.Timeouts.Pickup, &gc.Timeouts.Pickup}} {
		if *d.to, err = duration(d.field, d.v); err != nil {
			return gc, err
		}
	}
	return gc, nil
}

func duration(field, s string) (config.Duration, error) {
	if s == "" {
		return config.Duration{}, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return config.Duration{}, &notReady{ReasonInvalid, fmt.Sprintf("%s: %q is not a duration like 30s or 10m", field, s)}
	}
	return config.Duration{Duration: d}, nil
}

func cloneMap(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// secretRefs are the Secrets an object reads (namespace/name).
func secretRefs(ns string, sels ...*corev1.SecretKeySelector) []string {
	var out []string
	for _, s := range sels {
		if s != nil {
			out = append(out, ns+"/"+s.Name)
		}
	}
	return out
}
