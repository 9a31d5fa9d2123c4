package forge

import (
	"strings"
	"testing"
)

// Jobs are matched on the names the group's runners register: seed
// 001's exact ("linux") and schema ("ubuntu-latest" for
// "ubuntu-latest:docker://…") matches; a job asking for a label with its
// schema matches nothing, as at the forge (no runner registers that).
func TestMatch(t *testing.T) {
	group := NewLabelSet([]string{"ubuntu-latest:docker://node:20-bookworm", "linux", "gpu:host"})
	for _, c := range []struct {
		job  []string
		want bool
	}{
		{[]string{"ubuntu-latest"}, true},
		{[]string{"linux", "gpu"}, true},
		{[]string{"gpu:host"}, false},
		{[]string{"ubuntu-latest:docker://node:20-bookworm"}, false},
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

// Labels split as act_runner's and forgejo-runner's own tests have them
// (internal/pkg/labels): the name registered, the schema and argument
// kept; a label a runner would not register as written is refused,
// saying why.
func TestParseLabel(t *testing.T) {
	for _, c := range []struct {
		in, forge string
		want      Label
		refused   string
	}{
		{in: "ubuntu:docker://node:18", forge: "gitea", want: Label{"ubuntu", "docker", "//node:18"}},
		{in: "ubuntu:host", forge: "gitea", want: Label{"ubuntu", "host", ""}},
		{in: "ubuntu", forge: "gitea", want: Label{"ubuntu", "host", ""}},
		{in: "ubuntu-latest:docker://docker.gitea.com/runner-images:ubuntu-latest", forge: "gitea",
			want: Label{"ubuntu-latest", "docker", "//docker.gitea.com/runner-images:ubuntu-latest"}},
		{in: "alpine:lxc://alpine:3", forge: "forgejo", want: Label{"alpine", "lxc", "//alpine:3"}},
		{in: "alpine:lxc://alpine:3", forge: "gitea", want: Label{"alpine", "lxc", "//alpine:3"}, refused: `"lxc" after the ':'`},
		{in: "app:infra", forge: "gitea", want: Label{"app", "infra", ""}, refused: `write "app" (or "app:host")`},
		{in: "pool:e57e18d4-10d4-406f-93bf-60f127221bdd", forge: "forgejo", want: Label{"pool", "e57e18d4-10d4-406f-93bf-60f127221bdd", ""}, refused: "schema"},
		{in: "ubuntu:vm:ubuntu-18.04", forge: "gitea", want: Label{"ubuntu", "vm", "ubuntu-18.04"}, refused: `"vm"`},
		{in: ":host", forge: "gitea", want: Label{"", "host", ""}, refused: "no name"},
		{in: "", forge: "gitea", want: Label{"", "host", ""}, refused: "no name"},
		{in: "a b", forge: "gitea", want: Label{"a b", "host", ""}, refused: "space"},
	} {
		got := ParseLabel(c.in)
		if got != c.want {
			t.Errorf("ParseLabel(%q) = %+v, want %+v", c.in, got, c.want)
		}
		err := got.Check(c.forge)
		if (err != nil) != (c.refused != "") || (err != nil && !strings.Contains(err.Error(), c.refused)) {
			t.Errorf("%q on %s: %v, want refused %q", c.in, c.forge, err, c.refused)
		}
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
