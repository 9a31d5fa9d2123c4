package e2e

// The orchestrator unchanged on each real driver: its CPI in container
// mode, on a Kubernetes cluster, on a vCenter.

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/session"
	"github.com/vmware/govmomi/vim25"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"

	"github.com/runway-cpi/runway/src/forge"
	"github.com/runway-cpi/runway/src/testkit/cpibin"
	"github.com/runway-cpi/runway/src/testkit/netns"
	"github.com/runway-cpi/runway/src/testkit/rootfs"
	"github.com/runway-cpi/runway/src/testkit/testenv"
	"github.com/runway-cpi/runway/src/testkit/vcsim"
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
	base := testenv.Need(t, "scripts/rootfs-dev path; root, runc", "RUNWAY_TEST_ROOTFS")[0]
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
	e.writeCPIConfig("local", map[string]any{"stop_grace_seconds": 1, "isolation": "container",
		"container": map[string]any{"bridge": "rwe0", "cidr": cidr, "default_ephemeral_disk_mib": 64}})
	e.stemcell = filepath.Join(e.dir, "runner-rootfs.tgz")
	e.runnerPath = "/usr/local/bin/testrunner"
	must(t, rootfs.Extend(e.stemcell, base, map[string]string{e.runnerPath: bins.testrunner}))

	// Runners reach the forge at the bridge's host address.
	ln := listenInNetNS(t, ns)
	e.serveRunners(ln, registrations)
	port := ln.Addr().(*net.TCPAddr).Port
	host, _, _ := net.ParseCIDR(cidr)
	host[len(host)-1]++

	e.forgeYML = e.giteaForge(fmt.Sprintf("http://%s:%d", host, port), poll)
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

// The orchestrator unchanged, its CPI the kubernetes driver on the dev
// cluster (scripts/k8s-dev): the runner stemcell is a rootfs tarball
// holding the test runner, pushed to the cluster's registry by
// create_stemcell; every runner is a pod, started by its user data (the
// bootstrap), reaching the forge only at the host's end of the cluster's
// link; each pod is deleted once its job is done.
func TestRunnersInPods(t *testing.T) {
	env := testenv.Need(t, "scripts/k8s-dev start, then its $K8S_DEV_DIR/env",
		"RUNWAY_K8S_KUBECONFIG", "RUNWAY_K8S_NAMESPACE", "RUNWAY_K8S_REGISTRY", "RUNWAY_K8S_HOST_IP")
	var registrations atomic.Int64
	e := newEnv(t)
	cpi, err := cpibin.Path("kubernetes")
	must(t, err)
	e.cpiPath = cpi
	e.writeCPIConfig("kubernetes", map[string]any{
		"kubeconfig": env[0], "namespace": env[1], "delete_grace_seconds": 1, "wait_timeout_seconds": 60,
		"owner":    fmt.Sprintf("e2e-%d", os.Getpid()),
		"registry": map[string]any{"repository": env[2], "insecure": true}})

	// The runner image: busybox and a static test runner.
	runner := bins.testrunner // static: cpibin.Build
	e.runnerPath = "/bin/testrunner"
	e.stemcell = filepath.Join(e.dir, "runner-rootfs.tgz")
	must(t, rootfs.Write(e.stemcell, map[string]string{e.runnerPath: runner}))

	// Runners reach the forge at the host's address on the cluster's link.
	ln, err := net.Listen("tcp4", net.JoinHostPort(env[3], "0"))
	must(t, err)
	e.serveRunners(ln, &registrations)
	e.forgeYML = e.giteaForge("http://"+ln.Addr().String(), "300ms")

	e.threeJobsThrough("the cluster's link", &registrations, 90*time.Second)
	resp, err := e.cpi().Call(context.Background(), "info", "observe")
	must(t, err)
	if !strings.Contains(string(resp.Result), "warden-tar") {
		t.Errorf("info with a registry: %s; want warden-tar among the formats", resp.Result)
	}
}

// The orchestrator unchanged, its CPI the vsphere driver on govmomi's
// vCenter simulator: a queued job makes a runner VM (the OVF stemcell
// uploaded once, a linked clone whose guestinfo carries the runner's
// bootstrap for cloud-init). vcsim runs no guest, so the runner never
// registers: past the spawn timeout the orchestrator deletes the VM, and
// the next pass makes another — both paths on vSphere.
func TestRunnersAsVSphereVMs(t *testing.T) {
	sim := vcsim.Start(t)
	e := newEnv(t)
	cpi, err := cpibin.Path("vsphere")
	must(t, err)
	e.cpiPath = cpi
	section := sim.Section(map[string]any{"datacenters": []any{map[string]any{"name": "DC0", "datastore_pattern": `\ALocalDS_0\z`,
		"persistent_datastore_pattern": `\ALocalDS_`, "clusters": []any{"DC0_C0"}}}})
	e.writeCPIConfig("vsphere", section)
	group := fmt.Sprintf(`
  - name: linux
    scope: org
    org: acme
    labels: ["linux"]
    max_active_runners: 1
    stemcell: {image: %q}
    cloud_properties: {cpu: 1, ram: 512, disk: 1024}
    networks: {runners: {type: dynamic, cloud_properties: {name: "VM Network"}}}
    runner:
      command: /usr/local/bin/act_runner
    timeouts: {spawn: 3s, idle: 2m, max_lifetime: 10m}
`, vcsim.StemcellImage(t))
	e.writeConfig("300ms", group)
	e.gitea.AddJob("acme/app", "build", []string{"linux"}, forge.StatusQueued)
	e.start()
	var first string
	e.eventually(60*time.Second, "a runner VM on vCenter", func() bool {
		if vms := e.vms(); len(vms) == 1 && strings.HasPrefix(vms[0].CID, "vm-") {
			first = vms[0].CID
			return true
		}
		return false
	})
	// The bootstrap itself, not the agent settings that carry it in env.
	if ud := guestUserData(t, sim, first); !strings.Contains(ud, "act_runner") || json.Valid([]byte(ud)) {
		t.Errorf("the runner VM's guestinfo.userdata does not start the runner: %q", ud[:min(200, len(ud))])
	}
	e.eventually(60*time.Second, "the runner that never registered deleted, another made", func() bool {
		vms := e.vms()
		return len(vms) == 1 && vms[0].CID != first
	})
}

// guestUserData reads a VM's guestinfo.userdata, logged in as the test.
func guestUserData(t *testing.T, sim *vcsim.Sim, name string) string {
	t.Helper()
	ctx := context.Background()
	u := *sim.Server.URL
	c, err := vim25.NewClient(ctx, soap.NewClient(&u, true))
	must(t, err)
	must(t, session.NewManager(c).Login(ctx, u.User))
	ref, err := find.NewFinder(c, false).VirtualMachine(ctx, "/DC0/vm/BOSH_VMs/"+name)
	must(t, err)
	var vm mo.VirtualMachine
	must(t, ref.Properties(ctx, ref.Reference(), []string{"config.extraConfig"}, &vm))
	for _, o := range vm.Config.ExtraConfig {
		if ov := o.GetOptionValue(); ov.Key == "guestinfo.userdata" {
			b, _ := base64.StdEncoding.DecodeString(ov.Value.(string))
			return string(b)
		}
	}
	return ""
}
