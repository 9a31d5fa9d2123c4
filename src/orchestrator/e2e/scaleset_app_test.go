package e2e

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

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
	must(t, os.WriteFile(e.hold, nil, 0o600))
	e.start()
	jobs := []int64{gh.AddJob("acme/app", []string{"runway-ss"}), gh.AddJob("acme/app", []string{"runway-ss"})}
	e.eventually(30*time.Second, "both jobs running", func() bool {
		return gh.Job(jobs[0]).Status == "in_progress" && gh.Job(jobs[1]).Status == "in_progress"
	})
	// The sweep lists the runners every second while they live: REST
	// requests enough to meet the token's end.
	e.eventually(30*time.Second, "the installation token minted again before it expired", func() bool { return gh.AppStats().Minted >= 2 })
	os.Remove(e.hold)
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
