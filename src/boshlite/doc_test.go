package boshlite

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// guide is docs/bosh-lite.md as CI runs it: its files (a fenced block
// after a line ending in `NAME`:) and its steps (a fenced sh block after
// <!-- step: NAME -->), so that what the page tells a reader to run is
// what passes here.
type guide struct {
	files map[string]string
	steps map[string]string
	order []string // file names in the page's order
}

var (
	fileLabel   = regexp.MustCompile("`([^`]+)`:$")
	inlineFile  = regexp.MustCompile("^`([^`]+)`: `([^`]+)`$")
	stepLabel   = regexp.MustCompile(`^<!-- step: ([a-z0-9-]+) -->$`)
	fenceOpener = regexp.MustCompile("^```")
)

func readGuide(path string) (*guide, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	g := &guide{files: map[string]string{}, steps: map[string]string{}}
	lines := strings.Split(string(b), "\n")
	var file, step string
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if m := inlineFile.FindStringSubmatch(l); m != nil {
			g.add(m[1], m[2]+"\n")
			continue
		}
		if fenceOpener.MatchString(l) {
			end := i + 1
			for end < len(lines) && lines[end] != "```" {
				end++
			}
			if end == len(lines) {
				return nil, fmt.Errorf("%s:%d: a fenced block with no end", path, i+1)
			}
			body := strings.Join(lines[i+1:end], "\n") + "\n"
			switch {
			case step != "":
				if _, dup := g.steps[step]; dup {
					return nil, fmt.Errorf("%s:%d: step %s twice", path, i+1, step)
				}
				g.steps[step] = body
			case file != "":
				g.add(file, body)
			}
			file, step, i = "", "", end
			continue
		}
		if strings.TrimSpace(l) == "" {
			continue
		}
		file, step = "", ""
		if m := stepLabel.FindStringSubmatch(l); m != nil {
			step = m[1]
		} else if m := fileLabel.FindStringSubmatch(l); m != nil {
			file = m[1]
		}
	}
	return g, nil
}

func (g *guide) add(name, body string) {
	if _, ok := g.files[name]; !ok {
		g.order = append(g.order, name)
	}
	g.files[name] = body
}

// buildSteps make the tools, the release and the stemcells.
var buildSteps = map[string]bool{"tools": true, "release": true, "stemcell": true, "webapp-release": true, "stemcell-bind": true}

// runner runs the guide's steps in a network namespace (or on the
// host's, ns ""), each in bash
// with the environment the previous step left exported.
type runner struct {
	t     *testing.T
	g     *guide
	subst *strings.Replacer
	ns    string
	work  string
	env   []string
	logs  string
	repo  string // the repository's root
	srv   string // /srv/bosh of the guide
	cpi   string // bin/cpi
	// cgroup: on the host's network, the steps' processes are put in it.
	cgroup string
}

// step runs step name in dir and returns what it printed; a failing
// step fails the test with its output and where the logs are.
func (r *runner) step(name, dir string) string {
	r.t.Helper()
	body, ok := r.g.steps[name]
	if !ok {
		r.t.Fatalf("docs/bosh-lite.md has no step %q", name)
	}
	envFile := filepath.Join(r.work, ".env")
	script := "set -euo pipefail\n" + r.subst.Replace(body) + "env -0 >" + envFile + "\n"
	cmd := exec.Command("nsenter", "--net=/run/netns/"+r.ns, "--", "bash", "-c", script)
	if buildSteps[name] || r.ns == "" {
		// Builds: on the host's network (debootstrap reaches the mirror).
		cmd = exec.Command("bash", "-c", script)
	}
	if r.cgroup != "" {
		cmd = exec.Command("sh", "-c", `echo $$ >"$0/cgroup.procs" && exec bash -c "$1"`, r.cgroup, script)
	}
	cmd.Dir = dir
	cmd.Env = r.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	err := cmd.Run()
	os.WriteFile(filepath.Join(r.logs, name+".log"), out.Bytes(), 0o644)
	if err != nil {
		r.t.Fatalf("step %s (docs/bosh-lite.md) failed after %s: %v\n%s\n(logs: %s)", name, time.Since(start).Round(time.Second), err, tail(out.String(), 60), r.logs)
	}
	r.t.Logf("step %s: %s", name, time.Since(start).Round(100*time.Millisecond))
	if b, err := os.ReadFile(envFile); err == nil {
		r.env = strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	}
	return out.String()
}

func tail(s string, n int) string {
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
