package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/agentprofile"
	"github.com/runway-cpi/runway/src/testkit/agentprobe"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// capBits are the capabilities the agent profile grants, by number.
var capBits = map[string]int{"CAP_AUDIT_WRITE": unix.CAP_AUDIT_WRITE, "CAP_KILL": unix.CAP_KILL,
	"CAP_NET_BIND_SERVICE": unix.CAP_NET_BIND_SERVICE, "CAP_CHOWN": unix.CAP_CHOWN, "CAP_DAC_OVERRIDE": unix.CAP_DAC_OVERRIDE,
	"CAP_FOWNER": unix.CAP_FOWNER, "CAP_FSETID": unix.CAP_FSETID, "CAP_SETUID": unix.CAP_SETUID, "CAP_SETGID": unix.CAP_SETGID,
	"CAP_SYS_ADMIN": unix.CAP_SYS_ADMIN, "CAP_NET_ADMIN": unix.CAP_NET_ADMIN, "CAP_SYS_CHROOT": unix.CAP_SYS_CHROOT}

// cloud_properties.bosh_agent gave the agent profile whatever the config
// said. It is the config's to allow now (kubernetes.bosh_agent): without
// it the VM type is refused by name, even in a namespace that would
// admit the pod, and nothing is made.
func TestAgentProfileOnlyWhereTheConfigAllowsIt(t *testing.T) {
	c := devCluster(t)
	ac := c.agentNamespace(t)
	agentNS := ac.ns
	ctx := context.Background()
	d := newTestDriver(t, ac, map[string]any{"namespace": agentNS})
	sc, _ := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"image": c.image})})
	vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "agent", StemcellCID: sc,
		CloudProps: driver.PropsOf(map[string]any{"bosh_agent": true, "command": []string{"sleep", "3600"}})})
	if err == nil {
		d.DeleteVM(ctx, vm.CID)
		t.Fatalf("bosh_agent without kubernetes.bosh_agent: made %s; want it refused", vm.CID)
	}
	if !errors.Is(err, driver.ErrInvalidInput) || !strings.Contains(err.Error(), "cloud_properties.bosh_agent") || !strings.Contains(err.Error(), "kubernetes.bosh_agent") {
		t.Errorf("bosh_agent without kubernetes.bosh_agent: %v; want ErrInvalidInput naming both", err)
	}
}

// An agent pod ran a program on the host as uid 0 (cgroup v1's
// release_agent): its root was the node's. Agent pods now get a user
// namespace (hostUsers false). This node's runtime (containerd 1.6)
// cannot make one: the kubelet leaves the pod Pending with a
// FailedCreatePodSandBox event, and create_vm answers at once a
// VMCreationFailed (not retryable) naming kubernetes.host_equivalent_agents,
// leaving no pod and no Secret. With that key the pod is what the docs
// say: root on the node — the host's uid map, and a cgroup v1 hierarchy
// (the release_agent route) mounts.
func TestAgentPodsAreNotRootOnTheNode(t *testing.T) {
	c := devCluster(t)
	ac := c.agentNamespace(t)
	agentNS := ac.ns
	ctx := context.Background()
	probe := []string{"sh", "-c", "cat /proc/self/uid_map; mkdir -p /tmp/cg && mount -t cgroup -o memory cgroup /tmp/cg && " +
		"[ -e /tmp/cg/release_agent ] && echo release_agent-reachable; exec sleep 3600"}

	d := newTestDriver(t, ac, map[string]any{"namespace": agentNS, "bosh_agent": true})
	sc, _ := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"image": c.image})})
	started := time.Now()
	vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "agent", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"bosh_agent": true, "command": probe})})
	if err == nil {
		out, _ := ac.admin.CoreV1().Pods(agentNS).GetLogs(vm.CID, &corev1.PodLogOptions{}).DoRaw(ctx)
		d.DeleteVM(ctx, vm.CID)
		t.Fatalf("an agent pod ran without a user namespace the config allows (%s):\n%s", vm.CID, out)
	}
	var ce *driver.CreationError
	if !errors.As(err, &ce) || ce.Retryable || !strings.Contains(err.Error(), "kubernetes.host_equivalent_agents") ||
		!strings.Contains(err.Error(), "user namespace") {
		t.Errorf("create_vm of an agent pod on a runtime without user namespaces: %v; want a VMCreationFailed, not retryable, naming kubernetes.host_equivalent_agents", err)
	}
	took := time.Since(started)
	if took > 30*time.Second {
		t.Errorf("the refusal took %s; want it as the kubelet reports it, not at the wait's end", took)
	}
	t.Logf("refused in %s: %v", took.Round(time.Millisecond), err)
	assertNoneLeft(t, ac)

	// Allowed by the host: root on the node.
	hd := newTestDriver(t, ac, map[string]any{"namespace": agentNS, "bosh_agent": true, "host_equivalent_agents": true})
	vm, err = hd.CreateVM(ctx, driver.VMSpec{AgentID: "agent", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"bosh_agent": true, "command": probe})})
	if err != nil {
		t.Fatal(err)
	}
	defer hd.DeleteVM(ctx, vm.CID)
	out := ac.logsUntil(t, vm.CID, "release_agent-reachable")
	if f := strings.Fields(out); len(f) < 3 || f[0] != "0" || f[1] != "0" || f[2] != "4294967295" {
		t.Errorf("a host-equivalent agent pod's uid map: %q; want the node's (0 0 4294967295)", out)
	}

	// The key switched off again: the pod made anew (reboot_vm) asks for
	// a user namespace, and is refused as create_vm's is.
	if err := d.RebootVM(ctx, vm.CID); err == nil || !strings.Contains(err.Error(), "kubernetes.host_equivalent_agents") {
		t.Errorf("reboot_vm of a host-equivalent agent pod with the key off: %v; want the refusal naming kubernetes.host_equivalent_agents", err)
	}
}

// A VM type with bosh_agent runs as root with exactly the agent's
// capabilities, and can do what the agent does at boot (mounts, hostname,
// users, ownership); a restricted namespace refuses it by name; a VM
// without it can do none of that.
func TestAgentProfile(t *testing.T) {
	c := devCluster(t)
	agentNS := testenv.Need(t, "scripts/k8s-dev start (its privileged namespace)", "RUNWAY_K8S_AGENT_NAMESPACE")[0]
	ctx := context.Background()
	boot := "{ mkdir -p /tmp/m && mount -t tmpfs none /tmp/m && hostname agent-vm && echo job:x:2000:2000::/tmp:/bin/sh >>/etc/passwd && " +
		"chown job /tmp/m && su job -c 'touch /tmp/m/ok'; } >/tmp/log 2>&1; echo $? >/tmp/status; exec sleep 3600"

	// The restricted namespace: refused, naming the property; nothing left.
	d := newTestDriver(t, c, map[string]any{"bosh_agent": true})
	sc, _ := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"image": c.image})})
	_, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "agent", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"bosh_agent": true, "command": boot})})
	var ce *driver.CreationError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "cloud_properties.bosh_agent") || !strings.Contains(err.Error(), "PodSecurity") {
		t.Errorf("bosh_agent in a restricted namespace: %v; want VMCreationFailed naming bosh_agent and Pod Security", err)
	}
	assertNoneLeft(t, c)
	if _, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "agent", StemcellCID: sc,
		CloudProps: driver.PropsOf(map[string]any{"bosh_agent": true, "run_as_user": 1000})}); !errors.Is(err, driver.ErrInvalidInput) {
		t.Errorf("bosh_agent with run_as_user: %v; want ErrInvalidInput", err)
	}

	// A namespace admitting privileged pods.
	ac := c
	ac.ns = agentNS
	ad := newTestDriver(t, ac, map[string]any{"namespace": agentNS, "bosh_agent": true, "host_equivalent_agents": true})
	vm, err := ad.CreateVM(ctx, driver.VMSpec{AgentID: "agent", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"bosh_agent": true, "command": boot})})
	if err != nil {
		t.Fatal(err)
	}
	defer ad.DeleteVM(ctx, vm.CID)
	out := ac.exec(t, vm.CID, "sh", "-c", "for i in $(seq 100); do [ -e /tmp/status ] && break; sleep 0.1; done; "+
		"[ \"$(cat /tmp/status)\" = 0 ] || { cat /tmp/log; exit 1; }; id -u; hostname; ls -ln /tmp/m/ok; grep -E '^Cap(Eff|Bnd):' /proc/1/status")
	want := uint64(0)
	for _, name := range append(append([]string{}, agentprofile.DefaultCaps...), agentprofile.Caps...) {
		bit, ok := capBits[name]
		if !ok {
			t.Fatalf("capability %s has no bit in this test", name)
		}
		want |= 1 << bit
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 5 || lines[0] != "0" || lines[1] != "agent-vm" || !strings.Contains(lines[2], " 2000 ") {
		t.Fatalf("agent VM: %q; want uid 0, hostname agent-vm, a file of uid 2000 on the tmpfs", out)
	}
	for _, l := range lines[3:] {
		f := strings.Fields(l)
		got, _ := strconv.ParseUint(f[1], 16, 64)
		if got != want {
			t.Errorf("%s %016x; want %016x (the agent's capabilities, nothing more)", f[0], got, want)
		}
	}

	// The same image without the profile in the same namespace: not root,
	// no mount.
	plain, err := ad.CreateVM(ctx, driver.VMSpec{AgentID: "plain", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"command": []string{"sleep", "3600"}})})
	if err != nil {
		t.Fatal(err)
	}
	defer ad.DeleteVM(ctx, plain.CID)
	out = ac.exec(t, plain.CID, "sh", "-c", "id -u; mount -t tmpfs none /tmp 2>/dev/null && echo mounted || echo refused")
	if out != fmt.Sprintf("%d\nrefused\n", 1000) {
		t.Errorf("restricted VM: %q; want uid 1000 and the mount refused", out)
	}
}

// A warden-style stemcell (scripts/rootfs-dev bosh: runit, monit, the
// vcap user, the agent's directories) pushed as a heavy stemcell boots in
// a bosh_agent pod and does what the agent and its jobs do as root — the
// persistent disk bind-mounted at /var/vcap/store, a job run by monit as
// vcap; without the profile, none of it.
func TestWardenStemcellBootsWithTheAgentProfile(t *testing.T) {
	c := devCluster(t)
	env := testenv.Need(t, "scripts/k8s-dev start; scripts/rootfs-dev path bosh",
		"RUNWAY_K8S_AGENT_NAMESPACE", "RUNWAY_K8S_REGISTRY", "RUNWAY_TEST_BOSH_ROOTFS")
	ctx := context.Background()
	reg := map[string]any{"repository": env[1], "insecure": true}
	ac := c
	ac.ns = env[0]
	ad := newTestDriver(t, ac, map[string]any{"namespace": ac.ns, "registry": reg, "bosh_agent": true, "host_equivalent_agents": true})
	sc, err := ad.CreateStemcell(ctx, driver.StemcellSpec{ImagePath: env[2],
		CloudProps: driver.PropsOf(map[string]any{"name": "bosh-warden-boshlite-debian-bookworm", "version": "0", "infrastructure": "warden"})})
	if err != nil {
		t.Fatal(err)
	}
	defer ad.DeleteStemcell(ctx, sc)
	disk, err := ad.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 16, CloudProps: driver.PropsOf(map[string]any{"storage_class": c.class})})
	if err != nil {
		t.Fatal(err)
	}
	defer ad.DeleteDisk(ctx, disk)
	probe := []string{"/bin/bash", "-c", agentprobe.Script}
	vm, err := ad.CreateVM(ctx, driver.VMSpec{AgentID: "agent", StemcellCID: sc, DiskCIDs: []string{disk},
		CloudProps: driver.PropsOf(map[string]any{"bosh_agent": true, "command": probe})})
	if err != nil {
		t.Fatal(err)
	}
	defer ad.DeleteVM(ctx, vm.CID)
	out := ac.logsUntil(t, vm.CID, "MONIT-OK")
	for _, s := range append(agentprobe.Steps, "STORE") {
		if !strings.Contains(out, s+"-OK\n") {
			t.Errorf("agent step %s:\n%s", s, out)
		}
	}
	if got := ac.exec(t, vm.CID, "cat", "/var/vcap/store/from-agent"); got != "kept\n" {
		t.Errorf("the agent's write to its store: %q", got)
	}

	// The same stemcell, restricted (another namespace's driver, the same
	// registry): every step refused.
	d := newTestDriver(t, c, map[string]any{"registry": reg})
	plain, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "plain", StemcellCID: sc, CloudProps: driver.PropsOf(map[string]any{"command": probe})})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteVM(ctx, plain.CID)
	out = c.logsUntil(t, plain.CID, "probe-init")
	for _, s := range agentprobe.Steps {
		if !strings.Contains(out, s+"-FAIL\n") {
			t.Errorf("agent step %s in a restricted VM:\n%s", s, out)
		}
	}
}
