package forge

import (
	"net/http"
	"testing"
)

func TestMatch(t *testing.T) {
	group := NewLabelSet([]string{"ubuntu-latest:docker://node:20-bookworm", "linux", "gpu:host"})
	for _, c := range []struct {
		job  []string
		want bool
	}{
		{[]string{"ubuntu-latest"}, true},
		{[]string{"linux", "gpu"}, true},
		{[]string{"gpu:host"}, true},
		{[]string{"linux", "arm64"}, false},
		{[]string{"ubuntu"}, false},
		{[]string{"docker"}, false},
		{nil, true},
	} {
		if got := Match(c.job, group); got != c.want {
			t.Errorf("Match(%v) = %v, want %v", c.job, got, c.want)
		}
	}
	if Match([]string{"ubuntu-latest"}, NewLabelSet([]string{"linux"})) {
		t.Error("no default labels may be assumed")
	}
}

func TestScopeCovers(t *testing.T) {
	for _, c := range []struct {
		s    Scope
		repo string
		want bool
	}{
		{Scope{Kind: "global"}, "a/b", true},
		{Scope{Kind: "org", Owner: "Acme"}, "acme/app", true},
		{Scope{Kind: "org", Owner: "acme"}, "other/app", false},
		{Scope{Kind: "repo", Owner: "acme", Repo: "app"}, "acme/app", true},
		{Scope{Kind: "repo", Owner: "acme", Repo: "app"}, "acme/lib", false},
		{Scope{Kind: "user", Owner: "bob"}, "bob/dots", true},
	} {
		if got := c.s.Covers(c.repo); got != c.want {
			t.Errorf("%v covers %s = %v", c.s, c.repo, got)
		}
	}
}

func TestVerify(t *testing.T) {
	body := []byte(`{"action":"queued"}`)
	secret := []byte("s3cret")
	sig := Sign(secret, body)
	for name, h := range map[string]http.Header{
		"gitea":  {"X-Gitea-Signature": {sig}},
		"hub256": {"X-Hub-Signature-256": {"sha256=" + sig}},
	} {
		if !Verify(secret, body, h) {
			t.Errorf("%s signature rejected", name)
		}
		if Verify([]byte("other"), body, h) {
			t.Errorf("%s signature accepted with the wrong secret", name)
		}
		if Verify(secret, append(body, ' '), h) {
			t.Errorf("%s signature accepted for a changed body", name)
		}
	}
	if Verify(secret, body, http.Header{}) {
		t.Error("an unsigned delivery verified")
	}
	if Verify(nil, body, http.Header{"X-Gitea-Signature": {Sign(nil, body)}}) {
		t.Error("an empty secret verified")
	}
}

func TestParseWorkflowJob(t *testing.T) {
	ev, err := ParseWorkflowJob([]byte(`{"action":"in_progress","workflow_job":{"id":7,"run_id":3,"labels":["linux"],
		"status":"in_progress","runner_name":"g-1","conclusion":null},"repository":{"full_name":"acme/app"}}`))
	if err != nil || ev.Action != "in_progress" || ev.Job.ID != 7 || ev.Job.Repo != "acme/app" || ev.Job.RunnerName != "g-1" {
		t.Fatalf("got %+v, %v", ev, err)
	}
	for _, bad := range []string{`{`, `{"action":"queued"}`, `{"action":"queued","workflow_job":{"id":"x"}}`} {
		if _, err := ParseWorkflowJob([]byte(bad)); err == nil {
			t.Errorf("%s parsed", bad)
		}
	}
}

func TestNextPage(t *testing.T) {
	h := http.Header{"Link": {`<https://x/api?page=3&limit=50>; rel="next", <https://x/api?page=9>; rel="last"`}}
	if n := NextPage(h); n != 3 {
		t.Errorf("next page %d", n)
	}
	if n := NextPage(http.Header{}); n != 0 {
		t.Errorf("no Link gave %d", n)
	}
}
