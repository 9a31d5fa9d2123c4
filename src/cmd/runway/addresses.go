package main

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/controller"
)

// kubePortAddr is the kubelet's variable for the kubernetes Service's
// address (KUBERNETES_PORT_443_TCP_ADDR): the chart's kubernetesAPI
// replaces KUBERNETES_SERVICE_HOST, not these.
var kubePortAddr = regexp.MustCompile(`^KUBERNETES_PORT_[0-9]+_TCP_ADDR=(.+)$`)

// addressPolicy is where forge URLs may not lead: AlwaysDenied, the
// cluster's API server (as this process reaches it, and its Service),
// this pod's node (HOST_IPS, from the downward API) and -forge-deny;
// -forge-allow overrides.
func addressPolicy(f *controllerFlags, apiHost string, environ []string) (*controller.AddressPolicy, error) {
	p := &controller.AddressPolicy{Deny: slices.Clone(controller.AlwaysDenied)}
	deny := func(host, what string) {
		if host == "" {
			return
		}
		addrs := []netip.Addr{}
		if a, err := netip.ParseAddr(host); err == nil {
			addrs = append(addrs, a)
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			addrs, _ = net.DefaultResolver.LookupNetIP(ctx, "ip", host)
			cancel()
		}
		for _, a := range addrs {
			p.Deny = append(p.Deny, controller.Denied{Prefix: netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), What: what})
		}
	}
	if !strings.Contains(apiHost, "://") {
		apiHost = "https://" + apiHost
	}
	if u, err := url.Parse(apiHost); err == nil {
		deny(u.Hostname(), "the cluster's API server")
	}
	env := map[string]string{}
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
		if m := kubePortAddr.FindStringSubmatch(kv); m != nil {
			deny(m[1], "the cluster's API server (its Service)")
		}
	}
	deny(env["KUBERNETES_SERVICE_HOST"], "the cluster's API server")
	for _, ip := range splitList(env["HOST_IPS"]) {
		deny(ip, "this controller's node (its kubelet)")
	}
	for _, c := range splitList(f.forgeDeny) {
		pr, err := prefix(c)
		if err != nil {
			return nil, fmt.Errorf("-forge-deny: %w", err)
		}
		p.Deny = append(p.Deny, controller.Denied{Prefix: pr, What: "in the operator's forgeURLs.deny"})
	}
	for _, c := range splitList(f.forgeAllow) {
		pr, err := prefix(c)
		if err != nil {
			return nil, fmt.Errorf("-forge-allow: %w", err)
		}
		p.Allow = append(p.Allow, pr)
	}
	return p, nil
}

// prefix reads a CIDR or a single address.
func prefix(s string) (netip.Prefix, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()), nil
	}
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return p, fmt.Errorf("%q is neither an address nor a CIDR", s)
	}
	return p.Masked(), nil
}
