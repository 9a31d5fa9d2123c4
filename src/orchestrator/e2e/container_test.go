package e2e

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/testkit/netns"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// The orchestrator unchanged, its CPI in container mode: runner VMs are
// containers made from a debootstrap rootfs holding the test runner, and
// reach the forge only through the bridge — the Gitea contract server
// listens a second time inside the network namespace bin/cpi runs in.
func TestRunnersInContainers(t *testing.T) {
	var registrations atomic.Int64
	e := containerEnv(t, "10.251.0.0/24", "300ms", &registrations)
	e.threeJobsThrough("the bridge", &registrations, 45*time.Second)
}

// threeJobsThrough queues three jobs for a group of three runners, and
// checks that each is run by a runner VM that registered at the address
// VMs reach the forge at (via; counted by registrations), and that every
// runner VM is deleted afterwards.
func (e *env) threeJobsThrough(via string, registrations *atomic.Int64, within time.Duration) {
	t := e.t
	e.writeConfig("300ms", e.group("linux", "scope: org\n    org: acme", []string{"linux"}, 3, ""))
	jobs := []int64{
		e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued),
		e.gitea.AddJob("acme/app", "test", []string{"linux"}, forge.StatusQueued),
		e.gitea.AddJob("acme/lib", "lint", []string{"linux"}, forge.StatusQueued),
	}
	e.start()
	e.eventually(within, "the jobs complete, run by runners reaching the forge through "+via, completed(e, jobs...))
	e.eventually(60*time.Second, "every runner VM is deleted", func() bool { return len(e.vms()) == 0 && len(e.runners(false)) == 0 })
	// Only a runner inside a VM could have used that address.
	if n := registrations.Load(); n != int64(len(jobs)) {
		t.Errorf("%d runners registered through %s, want %d", n, via, len(jobs))
	}
	for _, id := range jobs {
		if j := e.gitea.Job(id); !strings.HasPrefix(j.RunnerName, "linux-") {
			t.Errorf("job %d ran on %q", id, j.RunnerName)
		}
	}
}

// serveRunners serves the Gitea contract server on ln too, counting
// registrations: the address only runner VMs use.
func (e *env) serveRunners(ln net.Listener, registrations *atomic.Int64) {
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/Register") {
			registrations.Add(1)
		}
		e.gitea.Config.Handler.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	e.t.Cleanup(func() { srv.Close() })
}

// containerEnv is an env whose bin/cpi runs in container mode inside a
// network namespace of its own (bridge rwe0 on cidr, the host at its
// first address), with the test runner inside the rootfs stemcell, and
// the Gitea contract server listening a second time in the namespace for
// the runners (registrations counted).
func containerEnv(t testing.TB, cidr, poll string, registrations *atomic.Int64) *env {
	rootfs := testenv.Need(t, "scripts/rootfs-dev path; root, runc", "RUNWAY_TEST_ROOTFS")[0]
	if os.Geteuid() != 0 {
		t.Fatal("container mode needs root")
	}
	ns := fmt.Sprintf("rwe2e%d", os.Getpid())
	sh(t, "ip", "netns", "add", ns)
	// Registered first, so it runs last: after the env's cleanup, which
	// deletes VMs through bin/cpi in the namespace.
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	sh(t, "ip", "-n", ns, "link", "set", "lo", "up")
	e := newEnv(t)

	// bin/cpi, run by the daemon and by the test, always inside ns.
	e.cpiPath = filepath.Join(e.dir, "cpi-in-ns")
	must(t, os.WriteFile(e.cpiPath, []byte(fmt.Sprintf("#!/bin/sh\nexec nsenter --net=/run/netns/%s -- %s \"$@\"\n", ns, bins.cpi)), 0o755))
	b, _ := json.Marshal(map[string]any{"driver": "local", "state_dir": filepath.Join(e.dir, "cpi-state"),
		"local": map[string]any{"stop_grace_seconds": 1, "isolation": "container",
			"container": map[string]any{"bridge": "rwe0", "cidr": cidr, "default_ephemeral_disk_mib": 64}}})
	must(t, os.WriteFile(e.cpiCfg, b, 0o600))
	e.stemcell = filepath.Join(e.dir, "runner-rootfs.tgz")
	e.runnerPath = "/usr/local/bin/testrunner"
	must(t, withFile(rootfs, e.stemcell, bins.testrunner, e.runnerPath[1:]))

	// Runners reach the forge at the bridge's host address.
	ln := listenInNetNS(t, ns)
	e.serveRunners(ln, registrations)
	port := ln.Addr().(*net.TCPAddr).Port
	host, _, _ := net.ParseCIDR(cidr)
	host[len(host)-1]++

	e.forgeYML = fmt.Sprintf(`
  - name: gitea
    type: gitea
    url: %s
    runner_url: http://%s:%d
    token_file: %s
    webhook_secret_file: %s
    poll_interval: %s`, e.gitea.URL, host, port, filepath.Join(e.dir, "api-token"), filepath.Join(e.dir, "hook-secret"), poll)
	return e
}

func sh(t testing.TB, argv ...string) {
	t.Helper()
	if out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(argv, " "), err, out)
	}
}

// listenInNetNS opens a TCP listener on all addresses of namespace ns (a
// socket keeps the namespace it was made in).
func listenInNetNS(t testing.TB, ns string) net.Listener {
	var ln net.Listener
	var err error
	must(t, netns.Do(ns, func() { ln, err = net.Listen("tcp4", "0.0.0.0:0") }))
	must(t, err)
	return ln
}

// withFile writes dst: the rootfs tarball src plus the executable file at
// name inside.
func withFile(src, dst, file, name string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	gz, err := gzip.NewReader(in)
	if err != nil {
		return err
	}
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	defer out.Close()
	zw, _ := gzip.NewWriterLevel(out, gzip.BestSpeed)
	tw := tar.NewWriter(zw)
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
	body, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: "./" + name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
		return err
	}
	if _, err := tw.Write(body); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return zw.Close()
}
