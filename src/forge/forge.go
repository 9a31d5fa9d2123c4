// Package forge is what the runner orchestrator needs of a CI forge (Gitea,
// Forgejo, GitHub): the jobs waiting for a runner, a runner registration, the
// registered runners, and webhook deliveries. Subpackages implement it
// over each forge's REST API.
package forge

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Job statuses as the orchestrator sees them. Gitea's `waiting` (blocked
// on needs, approval or concurrency) is not demand; neither is anything
// not listed here.
const (
	StatusQueued     = "queued"
	StatusInProgress = "in_progress"
	StatusCompleted  = "completed"
	StatusWaiting    = "waiting"
)

// Job is one CI job.
type Job struct {
	ID         int64     `json:"id"`
	RunID      int64     `json:"run_id"`
	Repo       string    `json:"repo"` // owner/name
	Name       string    `json:"name"`
	Labels     []string  `json:"labels"`
	Status     string    `json:"status"`
	Conclusion string    `json:"conclusion,omitempty"`
	RunnerName string    `json:"runner_name,omitempty"`
	URL        string    `json:"url,omitempty"` // API URL of the job itself
	CreatedAt  time.Time `json:"created_at"`
	// StartedAt and CompletedAt: zero until the forge sets them (Gitea
	// writes the Unix epoch for unset dates; read as zero).
	StartedAt   time.Time `json:"started_at,omitzero"`
	CompletedAt time.Time `json:"completed_at,omitzero"`
}

// Time reads a forge's date: before 1971 (Gitea's epoch for "unset") is
// no date.
func Time(t time.Time) time.Time {
	if t.Year() < 1971 {
		return time.Time{}
	}
	return t
}

// Runner is one runner registered at the forge.
type Runner struct {
	ID     int64    `json:"id"`
	Name   string   `json:"name"`
	Status string   `json:"status"` // online | offline
	Busy   bool     `json:"busy"`
	Labels []string `json:"labels"`
}

// Registration is what a new runner needs to join the forge. Exactly one
// of Token (Gitea; GitHub fallback) or JITConfig (GitHub) is set. Both are
// secrets.
type Registration struct {
	Token     string
	JITConfig string
	// RunnerID: the runner already exists at the forge (GitHub JIT,
	// Forgejo's REST registration).
	RunnerID int64
	// UUID is a Forgejo runner's identity; with Token (its secret) the
	// runner connects without registering itself.
	UUID string
}

// Scope is where runners register and which jobs they can see.
type Scope struct {
	Kind  string // global | org | user | repo | enterprise (GitHub scale sets)
	Owner string // org or user (and the repo's owner)
	Repo  string // repo name, for Kind repo
}

func (s Scope) String() string {
	switch s.Kind {
	case "repo":
		return "repo " + s.Owner + "/" + s.Repo
	case "global":
		return "global"
	default: // org, user, enterprise
		return s.Kind + " " + s.Owner
	}
}

// APIPrefix is the scope's path in Gitea's and Forgejo's API (they share
// the layout): /admin, /orgs/{org}, /user (the token's own user: a user
// scope is served only to that user), /repos/{owner}/{repo}.
func (s Scope) APIPrefix() (string, error) {
	switch s.Kind {
	case "global":
		return "/admin", nil
	case "org":
		return "/orgs/" + url.PathEscape(s.Owner), nil
	case "user":
		return "/user", nil
	case "repo":
		return "/repos/" + url.PathEscape(s.Owner) + "/" + url.PathEscape(s.Repo), nil
	}
	return "", fmt.Errorf("unknown scope %q", s.Kind)
}

// Covers reports whether a job of repo (owner/name) is visible in scope.
func (s Scope) Covers(repo string) bool {
	owner, name, _ := strings.Cut(repo, "/")
	switch s.Kind {
	case "global", "enterprise": // an enterprise's organizations are not known here
		return true
	case "org", "user":
		return strings.EqualFold(owner, s.Owner)
	case "repo":
		return strings.EqualFold(owner, s.Owner) && strings.EqualFold(name, s.Repo)
	}
	return false
}

// Specificity orders scopes for claiming: the most specific scope that
// can run a job claims it.
func (s Scope) Specificity() int {
	switch s.Kind {
	case "repo":
		return 3
	case "org", "user":
		return 2
	}
	return 1
}

// Client is one forge.
type Client interface {
	// Jobs lists the queued and in-progress jobs in scope, every page.
	Jobs(ctx context.Context, s Scope) ([]Job, error)
	// Job fetches one job again (to confirm it finished before a runner
	// is reaped on the strength of a listing).
	Job(ctx context.Context, j Job) (Job, error)
	// Register prepares a registration for a runner called name.
	Register(ctx context.Context, s Scope, name string, labels []string) (Registration, error)
	Runners(ctx context.Context, s Scope) ([]Runner, error)
	// DeleteRunner removes a registration; a missing runner is not an error.
	DeleteRunner(ctx context.Context, s Scope, id int64) error
	// DisableRunner stops a runner taking new jobs (a job it runs goes
	// on) where the forge can; it answers false where it cannot (GitHub,
	// which refuses instead to remove a runner running a job).
	DisableRunner(ctx context.Context, s Scope, id int64) (bool, error)
	// VerifyDelivery checks a webhook delivery's signature with the
	// forge's own scheme (constant time); an empty secret never verifies.
	VerifyDelivery(secret, body []byte, h http.Header) bool
}

// ErrNotFound is returned for a 404 from the forge.
var ErrNotFound = errors.New("not found")

// ErrRunnerBusy: the forge refuses to remove a runner because it runs a
// job (GitHub's REST API: 422; its Actions service:
// JobStillRunningException). The runner is kept: not a failure.
var ErrRunnerBusy = errors.New("the runner is running a job")

// APIError is a non-2xx answer from a forge.
type APIError struct {
	Method, URL string
	Status      int
	Message     string
	RetryAfter  time.Duration
}

func (e *APIError) Error() string {
	return fmt.Sprintf("%s %s: HTTP %d: %s", e.Method, e.URL, e.Status, e.Message)
}

func (e *APIError) Unwrap() error {
	if e.Status == 404 {
		return ErrNotFound
	}
	return nil
}

// Match reports whether a group whose runners register labels can run a
// job needing jobLabels: every job label is one of the names they
// register (seed 001's exact match, "linux", and its schema match,
// "ubuntu-latest" for "ubuntu-latest:docker://…"). A job asking for
// "x:docker://…" matches nothing: no runner registers that.
func Match(jobLabels []string, labels LabelSet) bool {
	for _, l := range jobLabels {
		if _, ok := labels[l]; !ok {
			return false
		}
	}
	return true
}

// LabelSet is the label names a group's runners register.
type LabelSet map[string]struct{}

// NewLabelSet indexes labels by the names their runners register.
func NewLabelSet(labels []string) LabelSet {
	s := LabelSet{}
	for _, name := range LabelNames(labels) {
		s[name] = struct{}{}
	}
	return s
}

// LabelNames are the names a runner registers for labels (ParseLabel):
// what Runway sends a forge that registers runners itself, what the
// test runner registers, and what jobs are matched on.
func LabelNames(labels []string) []string {
	out := make([]string, 0, len(labels))
	for _, l := range labels {
		out = append(out, ParseLabel(l).Name)
	}
	return out
}

// Label is a runner label as act_runner (gitea-runner) and
// forgejo-runner read it: name[:schema[:argument]], the schema host when
// there is none. The runner registers the name only; the schema and its
// argument say how it runs a job (docker://image: in that image).
type Label struct{ Name, Schema, Arg string }

// ParseLabel splits a label as the runners do (internal/pkg/labels:
// at the first two colons).
func ParseLabel(s string) Label {
	parts := strings.SplitN(s, ":", 3)
	l := Label{Name: parts[0], Schema: "host"}
	if len(parts) > 1 {
		l.Schema = parts[1]
	}
	if len(parts) > 2 {
		l.Arg = parts[2]
	}
	return l
}

// schemas are the schemas each forge's runner takes.
var schemas = map[string][]string{"gitea": {"host", "docker"}, "forgejo": {"host", "docker", "lxc"}, "github": {"host", "docker"}}

// Check says why a runner of forgeType could not register the label as
// written, if it could not. A schema the runner does not know is
// refused: act_runner up to 0.2.13 and forgejo-runner refuse to register
// with it ("unsupported schema"), later act_runners register the whole
// label as one name — which one a group's image runs, Runway cannot
// know, and the group would make runners that take none of its jobs.
func (l Label) Check(forgeType string) error {
	switch {
	case l.Name == "":
		return errors.New("no name before the ':' (a runner would register an empty label)")
	case strings.ContainsAny(l.Name+l.Schema+l.Arg, ", \t\r\n"):
		return errors.New("a comma or a space: runners split their labels there")
	case !slices.Contains(schemas[forgeType], l.Schema):
		return fmt.Errorf("the runner reads %q after the ':' as the label's schema, and takes only %s: "+
			"act_runner up to 0.2.13 and forgejo-runner refuse to register, later act_runners register %q whole; "+
			"write %q (or %q) to offer %q", l.Schema, strings.Join(schemas[forgeType], ", "), l.Name+":"+l.Schema+l.colonArg(),
			l.Name, l.Name+":host", l.Name)
	}
	return nil
}

func (l Label) colonArg() string {
	if l.Arg == "" {
		return ""
	}
	return ":" + l.Arg
}

// JobJSON is a job as both forges' REST APIs and `workflow_job` payloads
// spell it (runner_name and conclusion may be absent or null).
type JobJSON struct {
	ID          int64     `json:"id"`
	RunID       int64     `json:"run_id"`
	Name        string    `json:"name"`
	Labels      []string  `json:"labels"`
	Status      string    `json:"status"`
	Conclusion  string    `json:"conclusion"`
	RunnerName  string    `json:"runner_name"`
	URL         string    `json:"url"`
	CreatedAt   time.Time `json:"created_at"`
	StartedAt   time.Time `json:"started_at"`
	CompletedAt time.Time `json:"completed_at"`
}

// Job converts it, with the repository the caller knows it by.
func (j JobJSON) Job(repo string) Job {
	return Job{ID: j.ID, RunID: j.RunID, Repo: repo, Name: j.Name, Labels: j.Labels, Status: j.Status,
		Conclusion: j.Conclusion, RunnerName: j.RunnerName, URL: j.URL, CreatedAt: Time(j.CreatedAt),
		StartedAt: Time(j.StartedAt), CompletedAt: Time(j.CompletedAt)}
}

// Checker is a Client that can ask the forge for every endpoint a group
// will use and say precisely what the token may not do.
type Checker interface {
	Check(ctx context.Context, s Scope) error
}
