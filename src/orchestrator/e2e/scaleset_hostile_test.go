package e2e

import (
	"context"
	"encoding/json"
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
// of another kind (deleted, counted); on GHES a JobAvailable again for a
// job the group holds (not asked for again); on github.com a JobAvailable
// whose acquire answers 404 (dropped at once, counted, the stream goes
// on) and the session evicted (its refresh 404, its delete 400: a new
// one); the session's token expired mid-poll (refreshed). Every job gets
// exactly one runner, and no token or JIT config reaches the log, the API
// or the metrics.
func TestScaleSetSurvivesAHostileService(t *testing.T) { scaleSetFlows(t, survivesAHostileService) }

func survivesAHostileService(t *testing.T, flow forgetest.ActionsFlow) {
	e, gh := scaleSetEnv(t, flow, 3, "")
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
	e.holdJobs()
	held := gh.AddJob("acme/app", []string{"runway-ss"})
	e.eventually(30*time.Second, "the held job runs", func() bool { return gh.Job(held).Status == "in_progress" })
	if flow == forgetest.FlowGHES {
		gh.RedeliverAvailable(held)
	} else {
		gh.InjectMessage(set, jobAvailableMessage(902, gh.Job(held).RequestID))
		e.eventually(20*time.Second, "the offer github.com will not let acquire dropped", func() bool {
			return metricValue(e.metrics(), `runway_scaleset_dropped_messages_total{group="ss",reason="acquire_not_found"}`) == 1
		})
		opened := gh.ActionsStats().SessionsOpened
		gh.ExpireSessions()
		e.eventually(20*time.Second, "a new session after the service evicted it", func() bool {
			return gh.ActionsStats().SessionsOpened == opened+1 && gh.ActionsStats().ExpiredDeletes == 1
		})
	}
	gh.ExpireSessionTokens()
	last := gh.AddJob("acme/app", []string{"runway-ss"})
	e.eventually(30*time.Second, "a job after the token expired runs", func() bool { return gh.Job(last).Status == "in_progress" })
	e.releaseJobs()
	jobs := []int64{first, during, held, last}
	e.eventually(60*time.Second, "every job completes", func() bool { return gh.Completed(jobs...) })
	e.eventually(30*time.Second, "the runners are gone", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	st := gh.ActionsStats()
	if n := len(e.runners(true)); n != len(jobs) || st.AcquiredTwice != 0 || st.Refreshes == 0 {
		t.Errorf("%d runners for %d jobs; server %+v: want one each, nothing asked twice, the token refreshed", n, len(jobs), st)
	}
	secretsStayOut(t, e, gh.ActionsSecrets())
}

// jobAvailableMessage offers a job by request id, as GHES would.
func jobAvailableMessage(id, request int64) []byte {
	body, _ := json.Marshal([]map[string]any{{"messageType": "JobAvailable", "runnerRequestId": request,
		"jobId": "7d0e2f3a-0000-4000-8000-000000000001", "ownerName": "acme", "repositoryName": "app", "requestLabels": []string{"runway-ss"}}})
	b, _ := json.Marshal(map[string]any{"messageId": id, "messageType": "RunnerScaleSetJobMessages", "body": string(body),
		"statistics": map[string]int{"totalAssignedJobs": 1, "totalRunningJobs": 1}})
	return b
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
