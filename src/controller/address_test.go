package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/testkit/kubeyaml"
)

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
