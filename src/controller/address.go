package controller

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"sync"
	"time"
)

// Denied is a range of addresses a forge URL may not reach, and what
// they are.
type Denied struct {
	Prefix netip.Prefix
	What   string
}

// AlwaysDenied are refused in every cluster: the controller's own pod,
// the node's services, a cloud's metadata address.
var AlwaysDenied = []Denied{
	{netip.MustParsePrefix("127.0.0.0/8"), "loopback"}, {netip.MustParsePrefix("::1/128"), "loopback"},
	{netip.MustParsePrefix("169.254.0.0/16"), "link-local (a cloud's metadata address among them)"},
	{netip.MustParsePrefix("fe80::/10"), "link-local"}, {netip.MustParsePrefix("0.0.0.0/8"), "unspecified"},
	{netip.MustParsePrefix("::/128"), "unspecified"}, {netip.MustParsePrefix("224.0.0.0/4"), "multicast"},
	{netip.MustParsePrefix("ff00::/8"), "multicast"},
}

// AddressPolicy is where the forges of resources may be reached: a
// resource's author chooses its URL, and the controller sends the
// token there, so it is refused when its host is (or resolves to) a
// denied address — AlwaysDenied, the cluster's API server and nodes —
// unless the operator allows it (the chart's forgeURLs.allow). The
// engine's connections are held to it too (config.AddressGuard): a
// name that resolves elsewhere later, or a redirect, is refused at
// connect.
type AddressPolicy struct {
	Deny  []Denied
	Allow []netip.Prefix
	// Resolve looks a host name up (default: net.DefaultResolver).
	Resolve func(ctx context.Context, host string) ([]netip.Addr, error)

	mu    sync.Mutex
	cache map[string]resolved
}

type resolved struct {
	addrs []netip.Addr
	at    time.Time
}

// Check implements config.AddressGuard.
func (p *AddressPolicy) Check(a netip.Addr) error {
	a = a.Unmap()
	for _, allow := range p.Allow {
		if allow.Contains(a) {
			return nil
		}
	}
	for _, d := range p.Deny {
		if d.Prefix.Contains(a) {
			return fmt.Errorf("%s is %s: Runway sends a forge's token to no such address unless the operator allows it (the chart's forgeURLs.allow)", a, d.What)
		}
	}
	return nil
}

// resolveTTL bounds how long a host's addresses are reused (every
// reconcile checks its URL).
const resolveTTL = 30 * time.Second

// checkURL refuses a forge URL whose host is, or resolves to, an
// address the policy denies, naming field. A name that does not resolve
// now is let through: its connections are checked when made.
func (p *AddressPolicy) checkURL(field, raw string) error {
	if p == nil || raw == "" {
		return nil
	}
	u, err := url.Parse(raw)
	if err != nil {
		return &notReady{ReasonInvalid, fmt.Sprintf("%s: not a URL", field)}
	}
	host := u.Hostname()
	addrs, err := p.lookup(host)
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if err := p.Check(a); err != nil {
			return &notReady{ReasonForgeAddressRefused, fmt.Sprintf("%s: host %s: %v", field, host, err)}
		}
	}
	return nil
}

func (p *AddressPolicy) lookup(host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	p.mu.Lock()
	c, ok := p.cache[host]
	p.mu.Unlock()
	if ok && time.Since(c.at) < resolveTTL {
		return c.addrs, nil
	}
	resolve := p.Resolve
	if resolve == nil {
		resolve = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	addrs, err := resolve(ctx, host)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	if p.cache == nil {
		p.cache = map[string]resolved{}
	}
	p.cache[host] = resolved{addrs, time.Now()}
	p.mu.Unlock()
	return addrs, nil
}
