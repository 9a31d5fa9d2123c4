package e2e

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/forge/scaleset"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// foreignListener opens the scale set's session as a listener that is
// not the group's (another installation, ARC) would.
func foreignListener(t *testing.T, gh *forgetest.GitHub, name string, labels []string) (*scaleset.Client, *scaleset.Session) {
	scope := forge.Scope{Kind: "org", Owner: "acme"}
	c, err := scaleset.New(scaleset.Config{APIURL: gh.URL, ConfigURL: scaleset.ConfigURL(gh.URL, scope), Scope: scope,
		REST: forge.NewTransport(func() string { return "Bearer " + apiToken }), Actions: forge.NewTransport(nil)})
	must(t, err)
	ctx := context.Background()
	set, err := c.Ensure(ctx, scaleset.Spec{Name: name, RunnerGroupID: 1, Labels: labels})
	must(t, err)
	sess, err := c.OpenSession(ctx, set.ID, "someone-else")
	must(t, err)
	return c, sess
}

// The Actions service at its worst, one trouble after another, while
// jobs keep coming: the scale set's session held by a listener that is
// not the group's (a clear error, no job taken, the session never
// touched, then served once it is let go); the service down (requests
// retried, the listener waits on its session; the job queued meanwhile
// served once); a message too big to read (the session opened anew), one
// of another kind (deleted, counted), a JobAvailable again for a job the
// group holds (not asked for again); the session's token expired
// mid-poll (refreshed). Every job gets exactly one runner, and no token
// or JIT config reaches the log, the API or the metrics.
func TestScaleSetSurvivesAHostileService(t *testing.T) {
	e, gh := scaleSetEnv(t, 3, "")
	_, foreign := foreignListener(t, gh, "ss", []string{"runway-ss"})
	e.start()
	first := gh.AddJob("acme/app", []string{"runway-ss"})
	e.eventually(20*time.Second, "the conflict on the group's status", func() bool {
		return strings.Contains(e.groupStatus("ss").LastError, "held by another listener")
	})
	if st := gh.ActionsStats(); st.Acquires != 0 || len(e.runners(true)) != 0 {
		t.Fatalf("acted while another listener held the scale set: %+v, runners %v", st, e.runners(true))
	}
	must(t, foreign.Close(context.Background()))
	e.eventually(30*time.Second, "the first job runs once the session is let go", func() bool { return gh.Job(first).Status == "completed" })

	sessions := gh.ActionsStats().SessionsOpened
	gh.SetActionsDown(true)
	during := gh.AddJob("acme/app", []string{"runway-ss"})
	e.eventually(20*time.Second, "the listener's requests refused a few times", func() bool { return gh.ActionsStats().Unavailable >= 3 })
	gh.SetActionsDown(false)
	e.eventually(60*time.Second, "the job queued in the outage runs", func() bool { return gh.Job(during).Status == "completed" })
	if st := gh.ActionsStats(); st.SessionsOpened != sessions {
		t.Errorf("%d sessions opened: the outage should be waited out on the session", st.SessionsOpened)
	}

	set := gh.ScaleSets()[0].ID
	opened := gh.ActionsStats().SessionsOpened
	huge := append([]byte(`{"messageId": 900, "messageType": "RunnerScaleSetJobMessages", "body": "`), make([]byte, scaleset.MaxMessageBytes)...)
	gh.InjectMessage(set, huge)
	e.eventually(20*time.Second, "a new session after the huge message", func() bool { return gh.ActionsStats().SessionsOpened == opened+1 })
	odd, _ := json.Marshal(map[string]any{"messageId": 901, "messageType": "SomethingElse", "body": "", "statistics": map[string]int{}})
	gh.InjectMessage(set, odd)
	e.eventually(20*time.Second, "both refused", func() bool {
		ss := e.groupStatus("ss").ScaleSet
		return ss != nil && ss.RefusedMessages == 2 && ss.Session
	})
	must(t, os.WriteFile(e.hold, nil, 0o600))
	held := gh.AddJob("acme/app", []string{"runway-ss"})
	e.eventually(30*time.Second, "the held job runs", func() bool { return gh.Job(held).Status == "in_progress" })
	gh.RedeliverAvailable(held)
	gh.ExpireSessionTokens()
	last := gh.AddJob("acme/app", []string{"runway-ss"})
	e.eventually(30*time.Second, "a job after the token expired runs", func() bool { return gh.Job(last).Status == "in_progress" })
	os.Remove(e.hold)
	jobs := []int64{first, during, held, last}
	e.eventually(60*time.Second, "every job completes", func() bool {
		for _, id := range jobs {
			if gh.Job(id).Status != "completed" {
				return false
			}
		}
		return true
	})
	e.eventually(30*time.Second, "the runners are gone", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	st := gh.ActionsStats()
	if n := len(e.runners(true)); n != len(jobs) || st.AcquiredTwice != 0 || st.Refreshes == 0 {
		t.Errorf("%d runners for %d jobs; server %+v: want one each, nothing asked twice, the token refreshed", n, len(jobs), st)
	}
	secretsStayOut(t, e, gh.ActionsSecrets())
}

// secretsStayOut looks for every secret in the daemon's output, its API
// and its metrics.
func secretsStayOut(t *testing.T, e *env, secrets []string) {
	t.Helper()
	var api strings.Builder
	for _, p := range []string{"/api/v1/runners?all=true", "/api/v1/groups", "/", "/metrics"} {
		api.WriteString(e.page(p))
	}
	for what, text := range map[string]string{"daemon output": e.stderr.String(), "API, status page and metrics": api.String()} {
		for _, s := range secrets {
			if len(s) >= 8 && strings.Contains(text, s) {
				t.Errorf("%s contains a secret (%.8s...)", what, s)
			}
		}
	}
	if len(secrets) < 4 {
		t.Errorf("only %d secrets to look for", len(secrets))
	}
}
