package e2e

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/orchestrator/httpapi"
	"github.com/runway-cpi/runway/src/orchestrator/store"
	"github.com/runway-cpi/runway/src/testkit/forgetest"
)

// scaleSetEnv is an env whose forge is a GitHub contract server speaking
// flow (an hour's poll, a webhook secret for the groups that take
// webhooks) and whose group "ss" (org acme, label runway-ss) takes its
// demand from a runner scale set; more groups may follow. Not started.
func scaleSetEnv(t testing.TB, flow forgetest.ActionsFlow, maxActive int, extra string, more ...string) (*env, *forgetest.GitHub) {
	e, gh := gitHubForge(t, "1h")
	gh.SetActionsFlow(flow)
	groups := append([]string{e.group("ss", "scope: org\n    org: acme", []string{"runway-ss"}, maxActive,
		"    demand: scale_set\n"+extra)}, more...)
	e.writeConfig("", groups...)
	return e, gh
}

// scaleSetFlows runs a test against each flow the Actions service speaks:
// github.com's (jobs assigned by the service, known by jobId) and GHES
// 3.19's (offered, then acquired).
func scaleSetFlows(t *testing.T, test func(t *testing.T, flow forgetest.ActionsFlow)) {
	for _, f := range []forgetest.ActionsFlow{forgetest.FlowGitHubCom, forgetest.FlowGHES} {
		t.Run(f.String(), func(t *testing.T) { test(t, f) })
	}
}

// metricValue reads one series' value from /metrics text (-1: absent).
func metricValue(text, series string) float64 {
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` ([0-9.e+-]+)$`).FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// A scale-set group gets its jobs with nothing inbound and no REST
// listing, on either flow: each job's whole life — queued, assigned to
// (github.com) or acquired by (GHES) the scale set, its own JIT runner of
// the scale set made through bin/cpi and online, the job started and
// completed, the runner reaped. A webhook group of the same forge goes on
// as before. Metrics and status show the scale set as ARC users read it,
// and the flow the service spoke.
func TestScaleSetRunsJobsWithNothingInbound(t *testing.T) {
	scaleSetFlows(t, runsJobsWithNothingInbound)
}

func runsJobsWithNothingInbound(t *testing.T, flow forgetest.ActionsFlow) {
	e, gh := scaleSetEnv(t, flow, 4, "    scale_set: {name: runway-ss-set}\n",
		e2eGroup(t, "hooked", "scope: repo\n    repo: acme/web", []string{"linux"}, 2))
	e.start()
	e.eventually(20*time.Second, "the scale set's session", func() bool {
		ss := e.groupStatus("ss").ScaleSet
		return ss != nil && ss.Session
	})
	gh.AddHook("http://"+e.addr+"/webhooks/github", []byte(webhookSecret))
	var jobs []int64
	for range 3 {
		jobs = append(jobs, gh.AddJob("acme/app", []string{"runway-ss"}))
	}
	hooked := gh.AddJob("acme/web", []string{"linux"})
	e.eventually(60*time.Second, "every job completes", func() bool { return gh.Completed(append(jobs, hooked)...) })
	e.eventually(30*time.Second, "the runners are gone", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	sets := gh.ScaleSets()
	if len(sets) != 1 || sets[0].Name != "runway-ss-set" || strings.Join(sets[0].Labels, ",") != "runway-ss-set,runway-ss" {
		t.Fatalf("scale sets %+v; want runway-ss-set labelled with its name and runway-ss", sets)
	}
	rows := map[string]httpapi.RunnerView{}
	for _, r := range e.runners(true) {
		rows[r.Name] = r
	}
	for _, id := range jobs {
		j := gh.Job(id)
		if j.ScaleSet != sets[0].ID || !strings.HasPrefix(j.RunnerName, "ss-") {
			t.Errorf("job %d: scale set %d, runner %q; want the scale set's, an ss- runner", id, j.ScaleSet, j.RunnerName)
		}
		// Its life in order: queued, held by the set, its runner online,
		// started, completed; the runner then reaped as finished.
		if !(!j.Created.After(j.Acquired) && !j.Acquired.After(j.RunnerOnline) && !j.RunnerOnline.After(j.Started) && j.Started.Before(j.Completed)) {
			t.Errorf("job %d's life out of order: queued %s, held %s, runner online %s, started %s, completed %s", id,
				j.Created.Format(time.StampMicro), j.Acquired.Format(time.StampMicro), j.RunnerOnline.Format(time.StampMicro),
				j.Started.Format(time.StampMicro), j.Completed.Format(time.StampMicro))
		}
		if r := rows[j.RunnerName]; r.State != store.Deleted || !endedByItself(r.Reason) {
			t.Errorf("job %d's runner %s: %s (%s); want deleted as finished", id, j.RunnerName, r.State, r.Reason)
		}
	}
	if j := gh.Job(hooked); j.ScaleSet != 0 || !strings.HasPrefix(j.RunnerName, "hooked-") {
		t.Errorf("the webhook group's job: %+v", j)
	}
	byGroup := map[string]int{}
	for _, r := range e.runners(true) {
		byGroup[r.Group]++
	}
	if byGroup["ss"] != 3 || byGroup["hooked"] != 1 {
		t.Errorf("runners made per group %v; want ss 3, hooked 1", byGroup)
	}
	req := gh.Requests()
	for _, listing := range []string{"GET /orgs/acme/repos", "GET /repos/acme/app/actions/runs"} {
		if req[listing] != 0 {
			t.Errorf("%s asked %d times: the scale set's group lists no jobs", listing, req[listing])
		}
	}
	if req["POST /orgs/acme/actions/runners/generate-jitconfig"] != 0 {
		t.Errorf("REST JIT configs for the scale set's runners: %v", req)
	}
	m := e.metrics()
	for series, want := range map[string]float64{`runway_scaleset_session{group="ss"}`: 1, `runway_scaleset_assigned_jobs{group="ss"}`: 0,
		`runway_job_queue_seconds_count{group="ss"}`: 3, `runway_job_run_seconds_count{group="ss"}`: 3,
		`runway_runner_startup_seconds_count{group="ss"}`: 3} {
		if got := metricValue(m, series); got != want {
			t.Errorf("%s = %v; want %v", series, got, want)
		}
	}
	if got := metricValue(m, `runway_scaleset_desired_runners{group="ss"}`); got != 0 {
		t.Errorf("desired runners %v at rest; want 0", got)
	}
	page := e.page("/")
	if !strings.Contains(page, `data-scale-set="runway-ss-set"`) || !strings.Contains(page, `<td class="session">open</td>`) {
		t.Errorf("the status page shows no open session of runway-ss-set")
	}
	want := "assign"
	if flow == forgetest.FlowGHES {
		want = "acquire"
	}
	if ss := e.groupStatus("ss").ScaleSet; ss == nil || ss.Flow != want || ss.RefusedMessages != 0 || ss.DroppedMessages != 0 {
		t.Errorf("scale set status %+v; want flow %s, nothing refused or dropped", ss, want)
	}
}

// endedByItself: a reap reason of a runner whose job was done.
func endedByItself(reason string) bool {
	return reason == "job finished" || reason == "runner left the forge after its job" || strings.HasPrefix(reason, "runner process exited")
}

// e2eGroup is one more group for an env's config (the test runner as
// its command).
func e2eGroup(t testing.TB, name, scope string, labels []string, maxActive int) string {
	e := &env{t: t}
	return e.group(name, scope, labels, maxActive, "")
}

// page is a page of the daemon's as text.
func (e *env) page(path string) string {
	resp, err := http.Get("http://" + e.addr + path)
	must(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(e.t, err)
	return string(b)
}

// The group takes only what it can start: with room for two runners, two
// of five jobs are acquired (GHES) or assigned (github.com, by the
// capacity each poll tells) at the service, the others stay available,
// and never more than two runners exist; as jobs end, the rest follow,
// one runner each.
func TestScaleSetAcquiresOnlyWhatItCanStart(t *testing.T) {
	scaleSetFlows(t, acquiresOnlyWhatItCanStart)
}

func acquiresOnlyWhatItCanStart(t *testing.T, flow forgetest.ActionsFlow) {
	e, gh := scaleSetEnv(t, flow, 2, "")
	e.holdJobs()
	e.start()
	var jobs []int64
	for range 5 {
		jobs = append(jobs, gh.AddJob("acme/app", []string{"runway-ss"}))
	}
	acquired := func() int {
		n := 0
		for _, id := range jobs {
			if gh.Job(id).ScaleSet != 0 {
				n++
			}
		}
		return n
	}
	e.eventually(30*time.Second, "two runners busy", func() bool {
		n := 0
		for _, r := range e.runners(false) {
			if r.State == store.Busy {
				n++
			}
		}
		return n == 2
	})
	if n := acquired(); n != 2 {
		t.Fatalf("%d jobs acquired with room for 2", n)
	}
	if st := gh.ActionsStats(); st.MaxCapacity != 2 {
		t.Errorf("capacity told the service: %d; want 2", st.MaxCapacity)
	}
	e.releaseJobs()
	most := 0
	e.eventually(60*time.Second, "every job completes", func() bool {
		most = max(most, len(e.vms()))
		return gh.Completed(jobs...)
	})
	e.eventually(30*time.Second, "the runners are gone", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	if most > 2 {
		t.Errorf("%d VMs at once; want at most 2", most)
	}
	if n := len(e.runners(true)); n != 5 {
		t.Errorf("%d runners made for 5 jobs", n)
	}
	if st := gh.ActionsStats(); st.AcquiredTwice != 0 || st.SessionsOpened != 1 {
		t.Errorf("%+v: want one session and no job asked for twice", st)
	}
}

// A GitHub App installation end to end, no PAT anywhere: the forge names
// the App (its id, the installation, its private key's file); the daemon
// signs the App's JWT, mints an installation token and uses it for the
// REST API (the scale set's registration token, the runner list), and
// mints the next before it expires — here installation tokens last 4 s,
// so the run sees at least one refresh. Jobs run as ever, one runner
// each; no expired token is ever sent, no JWT refused; neither the key
// nor a token reaches the log, the API or the metrics.
func TestScaleSetGitHubApp(t *testing.T) {
	e, gh := gitHubForge(t, "1h")
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	must(t, err)
	gh.AddApp("4242", &key.PublicKey, 77)
	gh.SetInstallationTokenTTL(4 * time.Second)
	pemText := string(pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	keyFile := filepath.Join(e.dir, "app.pem")
	must(t, os.WriteFile(keyFile, []byte(pemText), 0o600))
	e.forgeYML = fmt.Sprintf(`
  - name: gh
    type: github
    url: %s
    runner_url: %s
    app: {id: "4242", installation_id: 77, private_key_file: %s}
    poll_interval: 1h`, gh.URL, gh.URL, keyFile)
	e.extraEnv = nil
	e.writeConfig("", e.group("ss", "scope: org\n    org: acme", []string{"runway-ss"}, 3, "    demand: scale_set\n"))
	e.holdJobs()
	e.start()
	jobs := []int64{gh.AddJob("acme/app", []string{"runway-ss"}), gh.AddJob("acme/app", []string{"runway-ss"})}
	e.eventually(30*time.Second, "both jobs running", func() bool {
		return gh.Job(jobs[0]).Status == "in_progress" && gh.Job(jobs[1]).Status == "in_progress"
	})
	// The sweep lists the runners every second while they live: REST
	// requests enough to meet the token's end.
	e.eventually(30*time.Second, "the installation token minted again before it expired", func() bool { return gh.AppStats().Minted >= 2 })
	e.releaseJobs()
	e.eventually(60*time.Second, "both jobs complete", func() bool {
		return gh.Job(jobs[0]).Status == "completed" && gh.Job(jobs[1]).Status == "completed"
	})
	e.eventually(30*time.Second, "the runners are gone", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	if st := gh.AppStats(); st.ExpiredUses != 0 || st.Refused != 0 || len(e.runners(true)) != 2 {
		t.Errorf("app %+v, %d runners: want no expired token sent, no JWT refused, one runner per job", st, len(e.runners(true)))
	}
	if n := gh.Requests()["POST /orgs/acme/actions/runners/registration-token"]; n == 0 {
		t.Errorf("no registration token asked for with the installation token")
	}
	var secrets []string
	for _, l := range strings.Split(pemText, "\n") {
		if len(l) >= 16 && !strings.HasPrefix(l, "-----") {
			secrets = append(secrets, l)
		}
	}
	secretsStayOut(t, e, append(append(secrets, gh.InstallationTokens()...), gh.ActionsSecrets()...))
}
