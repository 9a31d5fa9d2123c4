package config

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/logging"
)

// fieldErrors collects errors naming their field.
type fieldErrors []error

func (e *fieldErrors) bad(field, format string, args ...any) {
	*e = append(*e, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
}

// in marks the errors from the n-th on as those of list's i-th item.
func (e *fieldErrors) in(n int, list string, i int) {
	for _, err := range (*e)[n:] {
		if fe, ok := err.(*FieldError); ok {
			fe.List, fe.Index = list, i
		}
	}
}

func (c *Config) validate() error {
	var errs fieldErrors
	c.validateDaemon(&errs)
	validateSet(&errs, c.Forges, c.Groups)
	if len(c.Groups) == 0 {
		errs.bad("groups", "at least one group is required")
	}
	if len(c.Forges) == 0 {
		errs.bad("forges", "at least one forge is required")
	}
	return errors.Join(errs...)
}

// PrepareSet fills the defaults of forges and groups handed to a running
// engine by a source other than the file (Orchestrator.Replace), and
// validates them as the file's are: every error names its field
// (forges[i].…, groups[i].…). An empty set is valid there.
func PrepareSet(forges []ForgeConfig, groups []GroupConfig) error {
	defaultSet(forges, groups)
	var errs fieldErrors
	validateSet(&errs, forges, groups)
	return errors.Join(errs...)
}

// validateSet checks forges and groups together (a group names its forge).
func validateSet(errs *fieldErrors, forgeList []ForgeConfig, groupList []GroupConfig) {
	forges := validateForges(errs, forgeList)
	names := map[string]bool{}
	for i, g := range groupList {
		p, first := fmt.Sprintf("groups[%d]", i), len(*errs)
		if !nameRE.MatchString(g.Name) {
			errs.bad(p+".name", "%q must be lowercase letters, digits and dashes (it prefixes runner names)", g.Name)
		} else if names[g.Name] {
			errs.bad(p+".name", "%q is used twice", g.Name)
		}
		names[g.Name] = true
		g.validate(errs, p, forges)
		errs.in(first, "groups", i)
	}
}

// validateDaemon checks the daemon's own keys: store, log, HTTP, CPI.
func (c *Config) validateDaemon(errs *fieldErrors) {
	if c.StateDir == "" {
		errs.bad("state_dir", "required (the SQLite store and the daemon's lock live there)")
	}
	switch c.Store {
	case "sqlite":
		if c.Postgres != (PostgresConfig{}) {
			errs.bad("postgres", "set only with store: postgres")
		}
	case "postgres":
		if (c.Postgres.DSNFile == "") == (c.Postgres.DSNEnv == "") {
			errs.bad("postgres.dsn_file", "set exactly one of dsn_file or dsn_env (the DSN may hold a password: never inline)")
		}
	default:
		errs.bad("store", "%q must be sqlite or postgres", c.Store)
	}
	if _, err := logging.Level(c.LogLevel); err != nil {
		errs.bad("log_level", "%q: want debug, info, warn, error or none", c.LogLevel)
	}
	if c.HTTP.MaxConnections < 0 {
		errs.bad("http.max_connections", "must be positive")
	}
	if n := c.HTTP.MaxConnectionsPerClient; n < 1 || n > c.HTTP.MaxConnections {
		errs.bad("http.max_connections_per_client", "%d must be between 1 and http.max_connections (%d)", n, c.HTTP.MaxConnections)
	}
	// A timeout too short to read one request is a typo (1ns, 5ms).
	for name, d := range map[string]Duration{"http.read_header_timeout": c.HTTP.ReadHeaderTimeout, "http.read_timeout": c.HTTP.ReadTimeout,
		"http.read_body_timeout": c.HTTP.ReadBodyTimeout, "http.write_timeout": c.HTTP.WriteTimeout, "http.idle_timeout": c.HTTP.IdleTimeout} {
		if d.Duration < 100*time.Millisecond {
			errs.bad(name, "%s is too short to serve a request: at least 100ms", d.Duration)
		}
	}
	if v := c.CPI.StemcellAPIVersion; v < 1 || v > 3 {
		errs.bad("cpi.stemcell_api_version", "%d: the Director sends 1, 2 or 3", v)
	}
	if c.CPI.Path == "" {
		errs.bad("cpi.path", "required (the bin/cpi to call)")
	}
}

// validateForges checks the forges and answers them by name.
func validateForges(errs *fieldErrors, list []ForgeConfig) map[string]ForgeConfig {
	forges := map[string]ForgeConfig{}
	for i, f := range list {
		p, first := fmt.Sprintf("forges[%d]", i), len(*errs)
		if !nameRE.MatchString(f.Name) {
			errs.bad(p+".name", "%q must be lowercase letters, digits and dashes", f.Name)
		} else if _, dup := forges[f.Name]; dup {
			errs.bad(p+".name", "%q is used twice", f.Name)
		}
		forges[f.Name] = f
		if f.Type != "gitea" && f.Type != "github" && f.Type != "forgejo" {
			errs.bad(p+".type", "%q must be gitea, forgejo or github", f.Type)
		}
		if f.Type == "forgejo" && (f.WebhookSecretFile != "" || f.WebhookSecretEnv != "") {
			errs.bad(p+".webhook_secret_file", "Forgejo sends no workflow_job webhook: Runway polls it (leave the webhook secret out)")
		}
		if !strings.HasPrefix(f.URL, "http://") && !strings.HasPrefix(f.URL, "https://") {
			errs.bad(p+".url", "%q must be an http(s) URL", logging.RedactURLs(f.URL))
		}
		n := 0
		for _, set := range []bool{f.TokenFile != "", f.TokenEnv != "", f.App.Set()} {
			if set {
				n++
			}
		}
		switch {
		case f.Secrets != nil && (n > 0 || f.WebhookSecretFile != "" || f.WebhookSecretEnv != ""):
			errs.bad(p+".token_file", "a forge whose secrets come from memory names no file, variable or app")
		case f.Secrets == nil && n != 1 && f.Type == "github":
			errs.bad(p+".token_file", "set exactly one of token_file, token_env or app (tokens and keys are never inline)")
		case f.Secrets == nil && n != 1:
			errs.bad(p+".token_file", "set exactly one of token_file or token_env (tokens are never inline)")
		}
		if f.App.Set() {
			f.App.validate(errs, p+".app", f.Type)
		}
		if f.WebhookSecretFile != "" && f.WebhookSecretEnv != "" {
			errs.bad(p+".webhook_secret_file", "set at most one of webhook_secret_file or webhook_secret_env")
		}
		errs.in(first, "forges", i)
	}
	return forges
}

// validate checks a GitHub App's keys (p is their field path).
func (a AppConfig) validate(errs *fieldErrors, p, forgeType string) {
	if forgeType != "github" {
		errs.bad(p, "a GitHub App authenticates to GitHub only (the forge is %s)", forgeType)
	}
	if strings.TrimSpace(a.ID) == "" || strings.ContainsAny(a.ID, " \t\n/") {
		errs.bad(p+".id", "%q must be the App's id or client id", a.ID)
	}
	if a.InstallationID <= 0 {
		errs.bad(p+".installation_id", "must be the installation's id (a positive number)")
	}
	if (a.PrivateKeyFile == "") == (a.PrivateKeyEnv == "") {
		errs.bad(p+".private_key_file", "set exactly one of private_key_file or private_key_env (the key is never inline)")
	}
}

// validate checks one group (p is its field path).
func (g GroupConfig) validate(errs *fieldErrors, p string, forges map[string]ForgeConfig) {
	f, ok := forges[g.Forge]
	if !ok {
		errs.bad(p+".forge", "%q is not a configured forge", g.Forge)
	}
	g.validateScope(errs, p, f.Type)
	if g.Scope == "enterprise" && f.App.Set() {
		errs.bad(p+".scope", "GitHub does not let an App register enterprise runners: forge %s needs a classic PAT with manage_runners:enterprise", f.Name)
	}
	if len(g.Labels) == 0 {
		errs.bad(p+".labels", "at least one label is required (no default labels are added)")
	}
	for j, l := range g.Labels {
		// Demand is matched on the names runners register: a label they
		// cannot register as written would make runners that take none
		// of the jobs they were made for.
		if err := forge.ParseLabel(l).Check(f.Type); err != nil {
			errs.bad(fmt.Sprintf("%s.labels[%d]", p, j), "%q cannot be registered as written: %v", l, err)
		}
	}
	if g.MaxActiveRunners < 1 {
		errs.bad(p+".max_active_runners", "must be at least 1")
	}
	if g.MinIdle < 0 || g.MinIdle > g.MaxActiveRunners {
		errs.bad(p+".min_idle", "must be between 0 and max_active_runners")
	}
	switch {
	case g.Stemcell.CID != "" && g.Stemcell.Image != "":
		errs.bad(p+".stemcell", "set exactly one of cid or image")
	case g.Stemcell.CID == "" && g.Stemcell.Image == "" && len(g.Stemcell.CloudProperties) == 0:
		errs.bad(p+".stemcell", "set exactly one of cid or image, or cloud_properties alone for a light stemcell (its image named there)")
	}
	if g.Runner.Command == "" {
		errs.bad(p+".runner.command", "required (the runner or its bootstrap, as a path on the VM)")
	}
	for k := range g.Runner.Env {
		if !envRE.MatchString(k) {
			errs.bad(p+".runner.env", "%q is not an environment variable name", k)
		}
	}
	if g.SpawnConcurrency < 1 {
		errs.bad(p+".spawn_concurrency", "must be at least 1")
	}
	g.validateDemand(errs, p, f.Type)
}

// scaleSetNameRE: what a scale set may be called (letters, digits, '.',
// '-', '_'; ARC's chart allows 45).
var scaleSetNameRE = regexp.MustCompile(`^[A-Za-z0-9._-]{1,45}$`)

// validateDemand checks where the group's demand comes from.
func (g GroupConfig) validateDemand(errs *fieldErrors, p, forgeType string) {
	switch g.Demand {
	case DemandForge:
		if g.ScaleSet != (ScaleSetConfig{}) {
			errs.bad(p+".scale_set", "set only with demand: scale_set")
		}
	case DemandScaleSet:
		if forgeType != "github" {
			errs.bad(p+".demand", "scale_set is GitHub's (the group's forge is %s)", forgeType)
		}
		if n := g.ScaleSet.Name; n != "" && !scaleSetNameRE.MatchString(n) {
			errs.bad(p+".scale_set.name", "%q must be 1 to 45 letters, digits, '.', '-' or '_'", n)
		}
		if g.ScaleSet.RunnerGroupID < 0 {
			errs.bad(p+".scale_set.runner_group_id", "must be positive")
		}
	default:
		errs.bad(p+".demand", "%q must be forge or scale_set", g.Demand)
	}
}

// validateScope checks the group's scope against its forge's type.
func (g GroupConfig) validateScope(errs *fieldErrors, p, forgeType string) {
	switch g.Scope {
	case "global":
		if forgeType == "github" {
			errs.bad(p+".scope", "global is not supported on GitHub (use org or repo)")
		}
	case "org":
		if g.Org == "" {
			errs.bad(p+".org", "required for scope org")
		}
	case "user":
		if g.User == "" {
			errs.bad(p+".user", "required for scope user")
		}
		if forgeType == "github" {
			errs.bad(p+".scope", "user is not supported on GitHub (use org or repo)")
		}
	case "repo":
		if o, n, ok := strings.Cut(g.Repo, "/"); !ok || o == "" || n == "" || strings.Contains(n, "/") {
			errs.bad(p+".repo", "%q must be owner/name for scope repo", g.Repo)
		}
	case "enterprise":
		if g.Enterprise == "" || strings.Contains(g.Enterprise, "/") {
			errs.bad(p+".enterprise", "%q must be the enterprise's slug for scope enterprise", g.Enterprise)
		}
		if forgeType != "github" || g.Demand != DemandScaleSet {
			errs.bad(p+".scope", "enterprise is GitHub's, for demand: scale_set only (its REST API lists no enterprise's jobs)")
		}
	default:
		errs.bad(p+".scope", "%q must be one of global, org, user, repo, enterprise", g.Scope)
	}
}

var envRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
