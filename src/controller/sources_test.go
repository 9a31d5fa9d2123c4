package controller

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	giteav1 "github.com/runway-cpi/runway/src/controller/apis/gitea/v1alpha1"
	runwayv1 "github.com/runway-cpi/runway/src/controller/apis/runway/v1alpha1"
	"github.com/runway-cpi/runway/src/orchestrator/config"
	"github.com/runway-cpi/runway/src/testkit/kubeyaml"
)

// secrets is a secretReader over Secrets in memory (namespace ns).
type secrets map[string]map[string]string

func (s secrets) read(ns, field, name, key string) (string, error) {
	v, ok := s[name][key]
	if !ok || strings.TrimSpace(v) == "" {
		return "", &notReady{ReasonSecretMissing, field + ": no key " + key}
	}
	return strings.TrimSpace(v), nil
}

func appKeyPEM(t *testing.T) string {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}))
}

// A Forge's githubConfigSecret is read as actions-runner-controller reads
// it: github_token (a PAT), or github_app_id, github_app_installation_id
// and github_app_private_key; what is wrong is named by key, no value
// quoted; the engine's source then answers the App.
func TestGitHubConfigSecret(t *testing.T) {
	key := appKeyPEM(t)
	forgeOf := func(secret string) *runwayv1.Forge {
		return &runwayv1.Forge{ObjectMeta: metav1.ObjectMeta{Name: "gh", Namespace: "ns"},
			Spec: runwayv1.ForgeSpec{Type: "github", GitHubConfigSecret: secret}}
	}
	s := secrets{
		"pat":      {"github_token": "ghp-0123456789abcdef"},
		"app":      {"github_app_id": "123", "github_app_installation_id": "42", "github_app_private_key": key},
		"both":     {"github_token": "ghp-0123456789abcdef", "github_app_id": "123"},
		"no-inst":  {"github_app_id": "123", "github_app_private_key": key},
		"bad-inst": {"github_app_id": "123", "github_app_installation_id": "forty-two", "github_app_private_key": key},
		"bad-key":  {"github_app_id": "123", "github_app_installation_id": "42", "github_app_private_key": "-----BEGIN RSA PRIVATE KEY-----\nc2VjcmV0LWtleQ==\n-----END RSA PRIVATE KEY-----"},
		"empty":    {"other": "x"},
	}
	_, sec, err := runwayForge(forgeOf("pat"), s.read)
	if err != nil || sec.token != "ghp-0123456789abcdef" || sec.app.id != "" {
		t.Errorf("a PAT: %+v, %v", sec.app, err)
	}
	_, sec, err = runwayForge(forgeOf("app"), s.read)
	if err != nil || sec.token != "" || sec.app.id != "123" || sec.app.installation != 42 || sec.app.key != strings.TrimSpace(key) {
		t.Fatalf("an App: %v", err)
	}
	src := &secretSource{}
	src.set(sec.token, sec.hook, sec.app)
	var as config.AppSource = src
	if id, inst, k := as.App(); id != "123" || inst != 42 || k != strings.TrimSpace(key) {
		t.Errorf("the engine's source answers app %q installation %d", id, inst)
	}
	for name, want := range map[string]string{"both": "both github_token and github_app_id", "no-inst": "github_app_installation_id",
		"bad-inst": "github_app_installation_id is not a positive number", "bad-key": "github_app_private_key", "empty": "neither github_token nor github_app_id",
		"missing": "neither github_token nor github_app_id"} {
		_, _, err := runwayForge(forgeOf(name), s.read)
		var nr *notReady
		if !errors.As(err, &nr) || !strings.Contains(nr.msg, want) || !strings.Contains(nr.msg, "spec.githubConfigSecret") {
			t.Errorf("%s: %v; want spec.githubConfigSecret ... %s", name, err, want)
		}
		if err != nil && (strings.Contains(err.Error(), "c2VjcmV0") || strings.Contains(err.Error(), "ghp-")) {
			t.Errorf("%s: the error quotes a secret: %v", name, err)
		}
	}
	// A Secret the operator did not mark is refused as such (issue 46's
	// allow-list), not reported as lacking keys.
	refuse := func(ns, field, name, key string) (string, error) {
		return "", &notReady{ReasonSecretNotAllowed, field + ": Runway may not read Secret " + name}
	}
	var nr *notReady
	if _, _, err := runwayForge(forgeOf("app"), refuse); !errors.As(err, &nr) || nr.reason != ReasonSecretNotAllowed {
		t.Errorf("an unmarked githubConfigSecret: %v, want %s", err, ReasonSecretNotAllowed)
	}
}

// engineNameRE is what the engine takes as a group's or forge's name
// (config's nameRE).
var engineNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,38}$`)

// An object's name in the engine is one the engine takes, whatever the
// object is called, and two objects never share one: the same name in
// another kind or namespace, or two names that read the same once
// lowered and shortened, are told apart.
func TestEngineNames(t *testing.T) {
	seen := map[string]string{}
	for _, o := range [][3]string{{kindSeed, "team-a", "linux"}, {kindGroup, "team-a", "linux"}, {kindSeed, "team-b", "linux"},
		{kindGroup, "team-a", "A.Very.Long.Name.Of.A.Runner.Group.Beyond.Forty"}, {kindGroup, "team-a", "a-very-long-name-of-a-runner-group-beyond-fifty"},
		{kindGroup, "team-a", "..."}, {kindGroup, "team-a", "LINUX"}} {
		n := engineName(o[0], o[1], o[2])
		if !engineNameRE.MatchString(n) {
			t.Errorf("%v: %q is no engine name", o, n)
		}
		if prev, dup := seen[n]; dup {
			t.Errorf("%v and %s share %q", o, prev, n)
		}
		seen[n] = fmt.Sprint(o)
		if again := engineName(o[0], o[1], o[2]); again != n {
			t.Errorf("%v: %q then %q", o, n, again)
		}
	}
}

// recordingReader is a secretReader that records what it was asked.
type recordingReader struct {
	s     secrets
	asked []string
}

func (r *recordingReader) read(ns, field, name, key string) (string, error) {
	r.asked = append(r.asked, ns+"/"+name+"/"+key+" for "+field)
	return r.s.read(ns, field, name, key)
}

func seedOf(t *testing.T, spec string) *giteav1.RunnerGroup {
	t.Helper()
	u := kubeyaml.Parse(t, []byte(`{apiVersion: gitea.bpg.pw/v1alpha1, kind: RunnerGroup, metadata: {name: rg, namespace: team-a}, spec: `+spec+`}`))[0]
	var rg giteav1.RunnerGroup
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &rg); err != nil {
		t.Fatal(err)
	}
	return &rg
}

// A seed RunnerGroup becomes a Gitea forge and a group of it: its owner
// read as gitea-runner-operator reads a repo's (owner/name as written,
// else the user's, else the org's), its URL from either field, the
// seed's runner image, command and poll interval, its token from the
// authToken Secret; only the two Secrets it names are read, in its own
// namespace, each for its field, and a refusal names that field.
func TestSeedGroup(t *testing.T) {
	seed := Seed{Image: "registry.example/act_runner:1", Command: "/bin/runner", Args: []string{"-c", "x"}, PollInterval: 7 * time.Second,
		CloudProperties: map[string]any{"cpu": 2}}
	tokens := `registrationToken: {secretRef: {name: reg, key: token}}, authToken: {name: api, key: tok}`
	r := &recordingReader{s: secrets{"reg": {"token": "reg-0123456789"}, "api": {"tok": " api-0123456789 "}}}
	for _, c := range []struct{ spec, repo, org, user, url string }{
		{`{scope: repo, repo: acme/app, org: other, gitea: {url: "https://g"}, labels: [linux], maxActiveRunners: 2, ` + tokens + `}`, "acme/app", "", "", "https://g"},
		{`{scope: repo, repo: app, user: bob, org: acme, giteaURL: "https://h", labels: [linux], maxActiveRunners: 2, ` + tokens + `}`, "bob/app", "", "", "https://h"},
		{`{scope: repo, repo: app, org: acme, giteaURL: "https://h", labels: [linux], maxActiveRunners: 2, ` + tokens + `}`, "acme/app", "", "", "https://h"},
		{`{scope: org, org: acme, giteaURL: "https://h", labels: [linux], maxActiveRunners: 2, ` + tokens + `}`, "", "acme", "", "https://h"},
	} {
		r.asked = nil
		fc, gc, token, hook, err := seedGroup(seedOf(t, c.spec), seed, r.read)
		if err != nil {
			t.Fatalf("%s: %v", c.spec, err)
		}
		if gc.Repo != c.repo || gc.Org != c.org || gc.User != c.user || fc.URL != c.url || fc.Type != "gitea" || gc.Forge != fc.Name {
			t.Errorf("%s: forge %+v, group scope %s repo %q org %q user %q", c.spec, fc, gc.Scope, gc.Repo, gc.Org, gc.User)
		}
		if token != "api-0123456789" || hook != "" || gc.Stemcell.CloudProperties["image"] != seed.Image || gc.Runner.Command != "/bin/runner" ||
			fc.PollInterval.Duration != 7*time.Second || gc.MaxActiveRunners != 2 || gc.CloudProperties["cpu"] != 2 {
			t.Errorf("%s: token %q, group %+v", c.spec, token, gc)
		}
		if want := []string{"team-a/api/tok for spec.authToken", "team-a/reg/token for spec.registrationToken"}; !slices.Equal(r.asked, want) {
			t.Errorf("%s: read %q, want %q", c.spec, r.asked, want)
		}
		gc.CloudProperties["cpu"] = 64
		if seed.CloudProperties["cpu"] != 2 {
			t.Fatal("a group's cloud properties are the seed's own map")
		}
	}
	for spec, field := range map[string]string{
		`{scope: org, org: acme, giteaURL: "https://h", maxActiveRunners: 1, ` + tokens + `}`:                                                                               "spec.labels",
		`{scope: org, org: acme, giteaURL: "https://h", labels: [x], maxActiveRunners: 1, registrationToken: {name: none, key: k}, authToken: {name: api, key: tok}}`:       "spec.registrationToken",
		`{scope: org, org: acme, giteaURL: "https://h", labels: [x], maxActiveRunners: 1, registrationToken: {name: reg, key: token}, authToken: {name: api, key: absent}}`: "spec.authToken",
	} {
		var nr *notReady
		if _, _, _, _, err := seedGroup(seedOf(t, spec), Seed{}, r.read); !errors.As(err, &nr) || !strings.HasPrefix(nr.msg, field+":") {
			t.Errorf("%s: %v, want a refusal naming %s", spec, err, field)
		}
	}
}

// A Forge becomes the engine's forge with its token and webhook secret
// read for their fields; what is wrong is refused naming the field.
func TestRunwayForge(t *testing.T) {
	sel := func(name, key string) *corev1.SecretKeySelector {
		return &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: key}
	}
	r := &recordingReader{s: secrets{"gh": {"token": "ghp-0123456789", "hook": "hook-0123456789"}}}
	f := &runwayv1.Forge{ObjectMeta: metav1.ObjectMeta{Name: "github", Namespace: "team-a"},
		Spec: runwayv1.ForgeSpec{Type: "github", URL: "https://ghe.example/api/v3", Token: sel("gh", "token"), WebhookSecret: sel("gh", "hook"),
			PollInterval: "30s", RunnerGroupID: 3}}
	fc, sec, err := runwayForge(f, r.read)
	if err != nil || fc.Name != engineName(kindForge, "team-a", "github") || fc.URL != "https://ghe.example/api/v3" ||
		fc.PollInterval.Duration != 30*time.Second || fc.RunnerGroupID != 3 || sec.token != "ghp-0123456789" || sec.hook != "hook-0123456789" {
		t.Errorf("forge %+v, secrets %v, %v", fc, sec.token != "", err)
	}
	for field, edit := range map[string]func(*runwayv1.ForgeSpec){
		"spec.token":         func(s *runwayv1.ForgeSpec) { s.Token = nil },
		"spec.pollInterval":  func(s *runwayv1.ForgeSpec) { s.PollInterval = "-1m" },
		"spec.webhookSecret": func(s *runwayv1.ForgeSpec) { s.WebhookSecret = sel("gh", "other") },
	} {
		bad := f.DeepCopy()
		edit(&bad.Spec)
		var nr *notReady
		if _, _, err := runwayForge(bad, r.read); !errors.As(err, &nr) || !strings.HasPrefix(nr.msg, field+":") {
			t.Errorf("%s: %v, want a refusal naming it", field, err)
		}
	}
}

// A Runway RunnerGroup becomes a group with everything its spec says;
// a value the engine cannot take is refused naming its field.
func TestRunwayGroup(t *testing.T) {
	rg := &runwayv1.RunnerGroup{ObjectMeta: metav1.ObjectMeta{Name: "linux-ss", Namespace: "team-a"}, Spec: runwayv1.RunnerGroupSpec{
		Forge: "github", Scope: "org", Org: "acme", Labels: []string{"x"}, MaxActiveRunners: 3, MinIdle: 1, Priority: 2, SpawnConcurrency: 5,
		Image: "registry.example/runner:2", CloudProperties: &runtime.RawExtension{Raw: []byte(`{"cpu":2}`)},
		Runner:   runwayv1.Runner{Command: "/r", Args: []string{"--once"}, Env: map[string]string{"A": "b"}},
		Timeouts: runwayv1.Timeouts{Spawn: "2m", Idle: "5m", MaxLifetime: "1h", Pickup: "90s"}, PollInterval: "20s", Demand: config.DemandScaleSet}}
	gc, err := runwayGroup(rg, "f")
	if err != nil || gc.Name != engineName(kindGroup, "team-a", "linux-ss") || gc.Forge != "f" || gc.Org != "acme" || gc.MinIdle != 1 ||
		gc.Priority != 2 || gc.SpawnConcurrency != 5 || gc.Stemcell.CloudProperties["image"] != "registry.example/runner:2" ||
		gc.CloudProperties["cpu"] != float64(2) || gc.Runner.Env["A"] != "b" || gc.Timeouts.Spawn.Duration != 2*time.Minute ||
		gc.Timeouts.Idle.Duration != 5*time.Minute || gc.Timeouts.MaxLifetime.Duration != time.Hour || gc.Timeouts.Pickup.Duration != 90*time.Second ||
		gc.PollInterval.Duration != 20*time.Second {
		t.Errorf("group %+v, %v", gc, err)
	}
	if gc.ScaleSet.Name != "linux-ss" {
		t.Errorf("a scale set unnamed is the object's name: %q", gc.ScaleSet.Name)
	}
	named := rg.DeepCopy()
	named.Spec.ScaleSet = &runwayv1.ScaleSet{Name: "ss", RunnerGroupID: 4}
	if gc, _ := runwayGroup(named, "f"); gc.ScaleSet.Name != "ss" || gc.ScaleSet.RunnerGroupID != 4 {
		t.Errorf("a named scale set: %+v", gc.ScaleSet)
	}
	for field, edit := range map[string]func(*runwayv1.RunnerGroupSpec){
		"spec.cloudProperties":      func(s *runwayv1.RunnerGroupSpec) { s.CloudProperties.Raw = []byte(`[1`) },
		"spec.pollInterval":         func(s *runwayv1.RunnerGroupSpec) { s.PollInterval = "often" },
		"spec.timeouts.spawn":       func(s *runwayv1.RunnerGroupSpec) { s.Timeouts.Spawn = "-1s" },
		"spec.timeouts.idle":        func(s *runwayv1.RunnerGroupSpec) { s.Timeouts.Idle = "5" },
		"spec.timeouts.maxLifetime": func(s *runwayv1.RunnerGroupSpec) { s.Timeouts.MaxLifetime = "1d" },
		"spec.timeouts.pickup":      func(s *runwayv1.RunnerGroupSpec) { s.Timeouts.Pickup = "soon" },
	} {
		bad := rg.DeepCopy()
		edit(&bad.Spec)
		var nr *notReady
		if _, err := runwayGroup(bad, "f"); !errors.As(err, &nr) || nr.reason != ReasonInvalid || !strings.HasPrefix(nr.msg, field+":") {
			t.Errorf("%s: %v, want Invalid naming it", field, err)
		}
	}
}
