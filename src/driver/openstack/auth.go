package openstack

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"

	"github.com/runway-cpi/runway/src/driver/statecache"
)

// tokenMargin: a cached token is not used this close to its expiry (a
// create_vm plus its waits must finish on it).
const tokenMargin = 10 * time.Minute

// cachedToken is what the token cache file holds: the token and the
// endpoints picked from its catalog, so a warm bin/cpi makes no Keystone
// request at all.
type cachedToken struct {
	ID        string            `json:"id"`
	ExpiresAt time.Time         `json:"expires_at"`
	Endpoints map[string]string `json:"endpoints"` // compute, network, volume, image
}

func (t *cachedToken) fresh(now time.Time) bool {
	return t != nil && t.ID != "" && now.Add(tokenMargin).Before(t.ExpiresAt)
}

// session is the process's one authenticated client.
type session struct {
	pc        *gophercloud.ProviderClient
	endpoints map[string]string
}

// service builds a client for one catalog service.
func (s *session) service(kind string) (*gophercloud.ServiceClient, error) {
	ep := s.endpoints[kind]
	if ep == "" {
		return nil, fmt.Errorf("openstack: the catalog has no %s endpoint (%s)", kind, strings.Join(catalogTypes[kind], " or "))
	}
	sc := &gophercloud.ServiceClient{ProviderClient: s.pc, Endpoint: ep, Type: kind}
	switch kind {
	case "network":
		sc.ResourceBase = ep + "v2.0/"
	case "image", "load-balancer":
		sc.ResourceBase = ep + "v2/"
	case "compute":
		// 2.52: tags on create; 2.37+ wants networks "none" spelled out.
		sc.Microversion = "2.52"
	case "volume":
		sc.Microversion = "3.0"
	}
	return sc, nil
}

// catalogTypes: service types per kind, preferred first.
var catalogTypes = map[string][]string{
	"compute": {"compute"}, "network": {"network"}, "image": {"image"},
	"volume": {"volumev3", "block-storage"}, "load-balancer": {"load-balancer"},
}

// session authenticates once per process: from the shared token cache
// when it holds a fresh token, else by one Keystone login.
func (d *Driver) session(ctx context.Context) (*session, error) {
	d.once.Do(func() { d.sess, d.initErr = d.newSession(ctx) })
	return d.sess, d.initErr
}

func (d *Driver) newSession(ctx context.Context) (*session, error) {
	hc, err := d.cfg.httpClient()
	if err != nil {
		return nil, err
	}
	pc := &gophercloud.ProviderClient{HTTPClient: hc, IdentityEndpoint: d.cfg.AuthURL + "/"}
	pc.UserAgent.Prepend("runway-cpi")
	pc.UseTokenLock()
	tok := d.readTokenCache()
	if !tok.fresh(time.Now()) {
		if tok, err = d.login(ctx, ""); err != nil {
			return nil, err
		}
	} else {
		d.redact(tok.ID)
		d.Log.Debug("using the cached Keystone token", "expires", tok.ExpiresAt.Format(time.RFC3339))
	}
	pc.SetToken(tok.ID)
	s := &session{pc: pc, endpoints: tok.Endpoints}
	// A 401 (token revoked, or expired early) logs in again once.
	pc.ReauthFunc = func(ctx context.Context) error {
		t, err := d.login(ctx, pc.Token())
		if err != nil {
			return err
		}
		pc.SetToken(t.ID) // login redacted it
		return nil
	}
	return s, nil
}

// cachePath is the token cache file.
func (d *Driver) cachePath() string { return d.cacheFile("token") }

// cacheFile is per cloud and identity, so two configs never share a
// token or a flavor list.
func (d *Driver) cacheFile(kind string) string {
	c := d.cfg
	id := statecache.Name(8, c.AuthURL, c.Region, c.Interface, c.Username, c.UserID,
		c.UserDomainName, c.UserDomainID, c.ProjectName, c.ProjectID, c.ProjectDomainName, c.ProjectDomainID,
		c.ApplicationCredentialID, c.ApplicationCredentialName)
	return filepath.Join(d.stateDir, "openstack-"+kind+"-"+id+".json")
}

func (d *Driver) readTokenCache() *cachedToken { return readCache[cachedToken](d, "token") }

// readCache reads the cache file of kind; nil when caching is off or the
// file is missing or unreadable.
func readCache[T any](d *Driver, kind string) *T {
	if !d.cfg.tokenCache() || d.stateDir == "" {
		return nil
	}
	return statecache.Read[T](d.cacheFile(kind))
}

// writeCache replaces the cache file of kind atomically, readable by us
// alone.
func (d *Driver) writeCache(kind, what string, v any) {
	if !d.cfg.tokenCache() || d.stateDir == "" {
		return
	}
	if err := statecache.Write(d.cacheFile(kind), v); err != nil {
		d.Log.Warn("cannot write the "+what+" cache", "err", err)
	}
}

// login gets a token from Keystone. Under the cache lock, a token another
// process fetched meanwhile (and that is not the one that just failed,
// stale) is taken instead, so concurrent bin/cpi processes log in once.
func (d *Driver) login(ctx context.Context, stale string) (*cachedToken, error) {
	if d.cfg.tokenCache() && d.stateDir != "" && d.Locks != nil {
		unlock, err := d.Locks.Lock(ctx, "openstack-token")
		if err != nil {
			return nil, err
		}
		defer unlock()
		if t := d.readTokenCache(); t.fresh(time.Now()) && t.ID != stale {
			d.redact(t.ID)
			return t, nil
		}
	}
	hc, err := d.cfg.httpClient()
	if err != nil {
		return nil, err
	}
	// Its own client: a 401 here is bad credentials, not a reason to re-auth.
	pc := &gophercloud.ProviderClient{HTTPClient: hc, IdentityEndpoint: d.cfg.AuthURL + "/"}
	pc.UserAgent.Prepend("runway-cpi")
	identity := &gophercloud.ServiceClient{ProviderClient: pc, Endpoint: d.cfg.AuthURL + "/"}
	var res tokens.CreateResult
	err = d.Retry.Do(ctx, "openstack keystone login", func(ctx context.Context) error {
		res = tokens.Create(ctx, identity, d.authOptions())
		return res.Err
	})
	if err != nil {
		if status(err) == 401 {
			return nil, fmt.Errorf("openstack: Keystone at %s refused the credentials (401): check username/password or the application credential", d.cfg.AuthURL)
		}
		return nil, d.cloudErr("keystone login at "+d.cfg.AuthURL, err)
	}
	tok, err := res.ExtractToken()
	if err != nil {
		return nil, fmt.Errorf("openstack: Keystone at %s: reading the token: %w", d.cfg.AuthURL, err)
	}
	d.redact(tok.ID)
	cat, err := res.ExtractServiceCatalog()
	if err != nil {
		return nil, fmt.Errorf("openstack: Keystone at %s: reading the catalog: %w", d.cfg.AuthURL, err)
	}
	t := &cachedToken{ID: tok.ID, ExpiresAt: tok.ExpiresAt, Endpoints: d.pickEndpoints(cat)}
	if t.Endpoints["compute"] == "" {
		return nil, fmt.Errorf("openstack: Keystone at %s: the catalog has no compute endpoint for region %q, interface %s",
			d.cfg.AuthURL, d.cfg.Region, d.cfg.Interface)
	}
	d.Log.Info("logged in to Keystone", "auth_url", d.cfg.AuthURL, "expires", t.ExpiresAt.Format(time.RFC3339))
	d.writeCache("token", "token", t)
	return t, nil
}

// pickEndpoints chooses, per kind, the first catalog endpoint of the
// configured interface and region. No version discovery: the driver
// speaks fixed API versions every supported release serves.
func (d *Driver) pickEndpoints(cat *tokens.ServiceCatalog) map[string]string {
	out := map[string]string{}
	for kind, types := range catalogTypes {
	types:
		for _, typ := range types {
			for _, e := range cat.Entries {
				if e.Type != typ {
					continue
				}
				for _, ep := range e.Endpoints {
					if ep.Interface == d.cfg.Interface && (d.cfg.Region == "" || ep.Region == d.cfg.Region || ep.RegionID == d.cfg.Region) {
						out[kind] = gophercloud.NormalizeURL(ep.URL)
						break types
					}
				}
			}
		}
	}
	return out
}

func (d *Driver) authOptions() *tokens.AuthOptions {
	c := d.cfg
	o := &tokens.AuthOptions{
		IdentityEndpoint: c.AuthURL, Username: c.Username, UserID: c.UserID, Password: c.Password,
		DomainName: c.UserDomainName, DomainID: c.UserDomainID,
		ApplicationCredentialID: c.ApplicationCredentialID, ApplicationCredentialName: c.ApplicationCredentialName,
		ApplicationCredentialSecret: c.ApplicationCredentialSecret,
	}
	switch {
	case c.ProjectID != "":
		o.Scope = tokens.Scope{ProjectID: c.ProjectID}
	case c.ProjectName != "":
		o.Scope = tokens.Scope{ProjectName: c.ProjectName, DomainName: c.ProjectDomainName, DomainID: c.ProjectDomainID}
	}
	return o
}

var errNoSession = errors.New("openstack: no session")
