package controller

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	runwayv1 "github.com/runway-cpi/runway/src/controller/apis/runway/v1alpha1"
	"github.com/runway-cpi/runway/src/orchestrator/config"
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
