package forge

import (
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
