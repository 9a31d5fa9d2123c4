package integration_test

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/runway-cpi/runway/src/testkit/extimage"
	"github.com/runway-cpi/runway/src/testkit/netns"
)

// instanceKey is what the local driver names its host objects by
// (cgroups, runc containers, its nft table, its /run/runway dir): the
// first four bytes of its state dir's SHA-256, in hex.
func instanceKey(stateDir string) string {
	sum := sha256.Sum256([]byte(stateDir))
	return hex.EncodeToString(sum[:4])
}

// Container mode: the local driver with isolation "container", bin/cpi
// run inside a network namespace the suite makes, so its bridge and VM
// addresses exist there only.
func setupContainerMode(f *fixture, dir string, local map[string]any) {
	Expect(os.Geteuid()).To(Equal(0), "container mode needs root")
	f.Image = os.Getenv("RUNWAY_TEST_ROOTFS")
	Expect(f.Image).NotTo(BeEmpty(), "RUNWAY_TEST_ROOTFS must name a rootfs tarball (scripts/rootfs-dev path)")
	f.NetNS = fmt.Sprintf("rwit%d", os.Getpid())
	run("ip", "netns", "add", f.NetNS)
	DeferCleanup(func() { run("ip", "netns", "del", f.NetNS) })
	run("ip", "-n", f.NetNS, "link", "set", "lo", "up")
	f.Exec = []string{"nsenter", "--net=/run/netns/" + f.NetNS, "--"}
	// PID 1 of a container ignores SIGTERM unless it handles it.
	f.VMProps = map[string]any{"ram": 256, "cpu": 1,
		"command": "echo vm-output-on-stdout; echo vm-output-on-stderr >&2; trap 'exit 0' TERM; while :; do sleep 600 & wait $!; done"}
	local["isolation"] = "container"
	// The agent profile is allowed: a VM booting a stemcell's agent gets it.
	// Small writable layers: each is allocated in full when its VM is made.
	ctr := map[string]any{"bridge": "rwit0", "cidr": "10.250.0.0/22", "bosh_agent": true, "default_ephemeral_disk_mib": 64}
	if rt := os.Getenv("RUNWAY_IT_RUNTIME"); rt != "" { // runc (default) or crun
		p, err := exec.LookPath(rt)
		Expect(err).NotTo(HaveOccurred())
		ctr["runtime"] = p
	}
	local["container"] = ctr
}

func run(argv ...string) string {
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "%s: %s", strings.Join(argv, " "), out)
	return string(out)
}

// inNetNS runs f on a thread inside the suite's network namespace.
func inNetNS(f func()) { inNamedNetNS(fx.NetNS, f) }

func inNamedNetNS(name string, f func()) {
	ExpectWithOffset(1, netns.Do(name, f)).To(Succeed())
}

// listenIn opens a TCP listener inside network namespace ns.
func listenIn(ns, addr string) net.Listener {
	var ln net.Listener
	inNamedNetNS(ns, func() {
		var err error
		ln, err = net.Listen("tcp4", addr)
		Expect(err).NotTo(HaveOccurred())
	})
	return ln
}

// dialFrom connects from namespace ns (1 s): whether anything there can
// reach addr.
func dialFrom(ns, addr string) error {
	var err error
	inNamedNetNS(ns, func() {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
		}
	})
	return err
}

// httpGet fetches a path from a VM's address, from the suite's namespace.
func httpGet(addr, path string) (string, error) {
	var body string
	var err error
	inNetNS(func() {
		var c net.Conn
		if c, err = net.DialTimeout("tcp", addr, 2*time.Second); err != nil {
			return
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "GET %s HTTP/1.0\r\n\r\n", path)
		var b []byte
		b, err = io.ReadAll(c)
		body = string(b)
	})
	return body, err
}

func vmDir(cid string) string { return filepath.Join(fx.StateDir, "vms", cid) }

// vmRun is where a container VM's mount points are (its root file system,
// its disks), outside the state dir.
func vmRun(cid string) string {
	return filepath.Join("/run/runway", instanceKey(fx.StateDir), cid)
}

// diskImage is a container-mode disk's file system image.
func diskImage(disk string) string { return filepath.Join(fx.StateDir, "disks", disk, "disk.img") }

// inVM is a path among a running container VM's mount points as the host
// reaches it: through its supervisor's root (the VM's file systems are
// mounted in the supervisor's mount namespace only).
func inVM(cid, path string) string {
	b, err := os.ReadFile(filepath.Join(vmDir(cid), "pgid"))
	ExpectWithOffset(2, err).NotTo(HaveOccurred())
	return filepath.Join("/proc", strings.TrimSpace(string(b)), "root", vmRun(cid), path)
}

// vmRoot is a running container VM's root file system, seen from the host.
func vmRoot(cid string) string { return inVM(cid, "rootfs") }

func console(cid string) func() string {
	return func() string { b, _ := os.ReadFile(filepath.Join(vmDir(cid), "console.log")); return string(b) }
}

// createVM makes a VM with props and answers its cid and first address.
func createVM(stemcell string, props map[string]any, nets map[string]any) (string, string) {
	var res []json.RawMessage
	ExpectWithOffset(1, json.Unmarshal(call("create_vm", "agent-c", stemcell, props, nets, []string{}, map[string]any{}), &res)).To(Succeed())
	var got map[string]struct {
		IP string `json:"ip"`
	}
	ExpectWithOffset(1, json.Unmarshal(res[1], &got)).To(Succeed())
	ip := ""
	for _, n := range got {
		ip = n.IP
	}
	return asString(res[0]), ip
}

var dynamic = map[string]any{"default": map[string]any{"type": "dynamic"}}

// expectNothingLeft: no VM, mount, runtime state, cgroup or interface of
// the suite's VMs is left on the host.
func expectNothingLeft() {
	entries, _ := os.ReadDir(filepath.Join(fx.StateDir, "vms"))
	ExpectWithOffset(1, entries).To(BeEmpty(), "vm directories\n%s", cleanUpFailures())
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	ExpectWithOffset(1, string(mi)).NotTo(ContainSubstring(fx.StateDir), "mounts under the state dir")
	rt, _ := os.ReadDir(filepath.Join(fx.StateDir, "runtime"))
	ExpectWithOffset(1, rt).To(BeEmpty(), "containers in the runtime's state")
	runs, _ := os.ReadDir(filepath.Dir(vmRun("x")))
	ExpectWithOffset(1, runs).To(BeEmpty(), "vms' mount point directories")
	// The driver names its cgroups after a hash of the state dir.
	key := instanceKey(fx.StateDir)
	// The bridge ports' guard holds no element of a VM that is gone.
	guard := run("nsenter", "--net=/run/netns/"+fx.NetNS, "nft", "list", "table", "bridge", "runway_"+key)
	ExpectWithOffset(1, guard).NotTo(ContainSubstring("elements"), "the ports' guard")
	cg, _ := filepath.Glob("/sys/fs/cgroup/*/runway/" + key + "-*")
	ExpectWithOffset(1, cg).To(BeEmpty(), "cgroups left")
	// The host ends of VMs' veths are named rw<12 hex digits>.
	links := run("ip", "-n", fx.NetNS, "-o", "link", "show")
	ExpectWithOffset(1, links).NotTo(MatchRegexp(`\d+: rw[0-9a-f]{12}@`), "veths left")
	var table map[string]string
	b, err := os.ReadFile(filepath.Join(fx.StateDir, "ipam.json"))
	if err == nil {
		Expect(json.Unmarshal(b, &table)).To(Succeed())
		ExpectWithOffset(1, table).To(BeEmpty(), "addresses not released")
	}
	// Supervisors name their VM's directory in their environment.
	procs, _ := filepath.Glob("/proc/[0-9]*/environ")
	for _, p := range procs {
		b, _ := os.ReadFile(p)
		ExpectWithOffset(1, string(b)).NotTo(ContainSubstring(fx.StateDir), "a process of the suite's VMs: %s", p)
	}
}

// ownDriver is a container-mode driver of its own (state dir, bridge):
// a stemcell made from the suite's image, create_vm answering the cid and
// its address, the console of a VM; everything is deleted after the spec.
type ownDriver struct {
	state string
	call  func(method string, args ...any) json.RawMessage
	raw   func(method string, args ...any) Response
	sc    string
}

func newOwnDriver(container map[string]any) *ownDriver { return newOwnDriverWith(fx.Image, container) }

// newOwnDriverWith is newOwnDriver with the stemcell made from image.
func newOwnDriverWith(image string, container map[string]any) *ownDriver {
	return newOwnDriverFull(image, container, nil)
}

// newOwnDriverFull is newOwnDriverWith with more local keys.
func newOwnDriverFull(image string, container, more map[string]any) *ownDriver {
	return newOwnDriverAt(filepath.Join(GinkgoT().TempDir(), "state"), image, container, more)
}

// newOwnDriverAt is newOwnDriverFull with its state in dir state.
func newOwnDriverAt(state, image string, container, more map[string]any) *ownDriver {
	dir := GinkgoT().TempDir()
	cfg := filepath.Join(dir, "cpi.json")
	if _, ok := container["default_ephemeral_disk_mib"]; !ok {
		container["default_ephemeral_disk_mib"] = 64
	}
	local := map[string]any{"isolation": "container", "stop_grace_seconds": 2, "container": container}
	for k, v := range more {
		local[k] = v
	}
	b, _ := json.Marshal(map[string]any{"driver": "local", "state_dir": state, "local": local})
	Expect(os.WriteFile(cfg, b, 0o600)).To(Succeed())
	o := &ownDriver{state: state}
	o.raw = func(method string, args ...any) Response { return runWith(cfg, request(method, 2, args...)) }
	o.call = func(method string, args ...any) json.RawMessage {
		r := o.raw(method, args...)
		ExpectWithOffset(1, r.Error).To(BeNil(), "%s: %+v", method, r.Error)
		return r.Result
	}
	o.sc = asString(o.call("create_stemcell", image, map[string]any{}))
	DeferCleanup(func() { o.call("delete_stemcell", o.sc) })
	return o
}

func (o *ownDriver) vm(command string) (string, string) {
	var res []json.RawMessage
	ExpectWithOffset(1, json.Unmarshal(o.call("create_vm", "agent-own", o.sc, map[string]any{"command": command}, dynamic, []string{}, map[string]any{}), &res)).To(Succeed())
	var nets map[string]struct {
		IP string `json:"ip"`
	}
	ExpectWithOffset(1, json.Unmarshal(res[1], &nets)).To(Succeed())
	cid := asString(res[0])
	DeferCleanup(func() { o.call("delete_vm", cid) })
	return cid, nets["default"].IP
}

func (o *ownDriver) console(cid string) func() string {
	return func() string {
		b, _ := os.ReadFile(filepath.Join(o.state, "vms", cid, "console.log"))
		return string(b)
	}
}

var _ = describeContainer("container isolation", Ordered, func() {
	var stemcell string
	var made []string
	BeforeAll(func() {
		stemcell = asString(call("create_stemcell", fx.Image, map[string]any{"infrastructure": "warden"}))
		DeferCleanup(func() {
			for _, vm := range made {
				cleanUp("delete_vm", vm)
			}
			cleanUp("delete_stemcell", stemcell)
		})
	})
	vm := func(props map[string]any, nets map[string]any) (string, string) {
		cid, ip := createVM(stemcell, props, nets)
		made = append(made, cid)
		return cid, ip
	}

	It("gives each VM its hostname, its address on the bridge (reachable from the host) and the agent settings with it", func() {
		web, ip := vm(map[string]any{"command": "mkdir -p /www && hostname > /www/name && exec busybox httpd -f -p 8080 -h /www"}, dynamic)
		Expect(ip).To(HavePrefix("10.250."))
		Eventually(func() (string, error) { return httpGet(ip+":8080", "/name") }, "10s", "50ms").Should(ContainSubstring(web))
		// The bridge exists in the suite's namespace only.
		_, err := net.InterfaceByName("rwit0")
		Expect(err).To(HaveOccurred(), "the bridge was made in the host's namespace")

		b, err := os.ReadFile(filepath.Join(vmRoot(web), "var/vcap/bosh/warden-cpi-agent-env.json"))
		Expect(err).NotTo(HaveOccurred())
		var settings struct {
			AgentID  string `json:"agent_id"`
			Networks map[string]struct {
				IP string `json:"ip"`
			} `json:"networks"`
		}
		Expect(json.Unmarshal(b, &settings)).To(Succeed())
		Expect(settings.AgentID).To(Equal("agent-c"))
		Expect(settings.Networks["default"].IP).To(Equal(ip))
	})

	It("honours a manual network's address inside the range and refuses one outside", func() {
		manual := func(ip string) map[string]any {
			return map[string]any{"default": map[string]any{"type": "manual", "ip": ip, "netmask": "255.255.252.0", "gateway": "10.250.0.1"}}
		}
		cid, ip := vm(map[string]any{"command": "busybox ip -4 addr show eth0; trap 'exit 0' TERM; while :; do sleep 600 & wait $!; done"}, manual("10.250.1.77"))
		Expect(ip).To(Equal("10.250.1.77"))
		Eventually(console(cid), "10s", "50ms").Should(ContainSubstring("inet 10.250.1.77/22"))
		r := runRaw(request("create_vm", 2, "agent-x", stemcell, fx.VMProps, manual("192.168.7.7"), []string{}, map[string]any{}))
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Message).To(ContainSubstring("outside the vm network"))
		r = runRaw(request("create_vm", 2, "agent-x", stemcell, fx.VMProps, manual("10.250.1.77"), []string{}, map[string]any{}))
		Expect(r.Error).NotTo(BeNil(), "an address held by another vm")
		Expect(r.Error.Message).To(ContainSubstring("is held by vm " + cid))
	})

	It("keeps a VM from other VMs' and the host's processes and files, the state dir, the host's environment and extra capabilities", func() {
		n := rand.Int64()
		token := fmt.Sprintf("peer-token-%d", n)
		// sleep's extra argument is only a marker (it sleeps the sum).
		peer, _ := vm(map[string]any{"command": "trap 'exit 0' TERM; while :; do sleep 600 " + token + " 2>/dev/null & echo peer-ready; wait $!; done"}, dynamic)
		Eventually(console(peer), "10s", "20ms").Should(ContainSubstring("peer-ready"))
		probe := strings.Join([]string{
			"echo procs=$(ls /proc | grep -c '^[0-9]')",
			// The token is put together at run time and only ever held in
			// the shell's variables: no probe command line holds it.
			fmt.Sprintf("t=peer-token; t=$t-%d", n),
			`for f in /proc/[0-9]*/cmdline; do case "$(tr '\0' ' ' <$f 2>/dev/null)" in *"$t"*) echo SEES-PEER;; esac; done`,
			// Every VM's supervisor runs on the host with this variable.
			"cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' ' ' | grep -q RUNWAY_SUPERVISE_VM && echo SEES-HOST",
			"[ -e " + fx.StateDir + " ] && echo SEES-STATE",
			"[ -e " + filepath.Join(vmRun(peer), "rootfs") + " ] && echo SEES-PEER-FILES",
			"env | grep -q RUNWAY_IT_SECRET && echo SEES-HOST-ENV",
			"grep CapEff /proc/self/status",
			"echo probe-done",
			"trap 'exit 0' TERM; while :; do sleep 600 & wait $!; done",
		}, "; ")
		// The host's environment: bin/cpi runs with a secret in it.
		os.Setenv("RUNWAY_IT_SECRET", "host-secret")
		defer os.Unsetenv("RUNWAY_IT_SECRET")
		cid, _ := vm(map[string]any{"command": probe}, dynamic)
		Eventually(console(cid), "10s", "50ms").Should(ContainSubstring("probe-done"))
		out := console(cid)()
		for _, leak := range []string{"SEES-PEER", "SEES-HOST", "SEES-STATE", "SEES-PEER-FILES", "SEES-HOST-ENV"} {
			Expect(out).NotTo(ContainSubstring(leak))
		}
		// sh, its probe commands and sleep: a handful, not the host's.
		Expect(out).To(MatchRegexp(`procs=[1-6]\n`))
		// runc's defaults: CAP_AUDIT_WRITE, CAP_KILL, CAP_NET_BIND_SERVICE.
		Expect(out).To(ContainSubstring("CapEff:\t0000000020000420"))
	})

	It("keeps VMs from each other, filters syscalls and limits a VM that names no limits", func() {
		web, ip := vm(map[string]any{"command": "mkdir -p /www && hostname > /www/name && exec busybox httpd -f -p 8080 -h /www"}, dynamic)
		Eventually(func() (string, error) { return httpGet(ip+":8080", "/name") }, "10s", "50ms").Should(ContainSubstring(web))
		probe := "busybox nc -w 2 " + ip + " 8080 </dev/null && echo REACHED-PEER || echo peer-unreachable; " +
			"grep '^Seccomp:' /proc/self/status; cat /sys/fs/cgroup/memory/memory.limit_in_bytes 2>/dev/null; echo probe-done; " +
			"trap 'exit 0' TERM; while :; do sleep 600 & wait $!; done"
		// No ram or cpu: the configured defaults (2 GiB, 2 CPUs).
		cid, _ := vm(map[string]any{"command": probe}, dynamic)
		Eventually(console(cid), "15s", "50ms").Should(ContainSubstring("probe-done"))
		out := console(cid)()
		Expect(out).To(ContainSubstring("peer-unreachable"))
		Expect(out).NotTo(ContainSubstring("REACHED-PEER"))
		Expect(out).To(MatchRegexp(`Seccomp:\s+2`), "the default seccomp profile is on")
		Expect(out).To(ContainSubstring(fmt.Sprint(2048 << 20)))

		// container.allow_vm_to_vm: VMs of that bridge reach each other.
		open := newOwnDriver(map[string]any{"bridge": "rwopen0", "cidr": "10.250.9.0/24", "allow_vm_to_vm": true})
		_, openIP := open.vm("busybox httpd -f -p 8080 -h /")
		prober, _ := open.vm("until busybox nc -w 1 " + openIP + " 8080 </dev/null; do sleep 0.2; done; echo REACHED-PEER; " +
			"trap 'exit 0' TERM; while :; do sleep 600 & wait $!; done")
		Eventually(open.console(prober), "15s", "50ms").Should(ContainSubstring("REACHED-PEER"))
	})

	It("keeps the gateway's hardware address its own while VMs come and go", func() {
		// Left to the kernel, a bridge takes its lowest port's address,
		// changing the gateway's MAC under the VMs' ARP caches.
		o := newOwnDriver(map[string]any{"bridge": "rwmac0", "cidr": "10.250.12.0/24"})
		macs := func(args ...string) []string {
			out := run(append([]string{"ip", "-n", fx.NetNS, "-o", "link", "show"}, args...)...)
			return regexp.MustCompile(`link/ether ([0-9a-f:]+)`).FindAllString(out, -1)
		}
		idle := "trap 'exit 0' TERM; while :; do sleep 600 & wait $!; done"
		o.vm(idle)
		gateway := macs("dev", "rwmac0")
		Expect(gateway).To(HaveLen(1))
		for range 3 {
			o.vm(idle)
			Expect(macs("dev", "rwmac0")).To(Equal(gateway), "the gateway's address changed as a VM came")
		}
		ports := macs("master", "rwmac0")
		Expect(ports).To(HaveLen(4))
		Expect(ports).NotTo(ContainElement(gateway[0]), "the bridge wears a port's address")
	})

	It("uses only a bridge it made: an interface someone else has is refused by name and left as it was", func() {
		run("ip", "-n", fx.NetNS, "link", "add", "rwforeign0", "type", "bridge")
		DeferCleanup(func() { run("ip", "-n", fx.NetNS, "link", "del", "rwforeign0") })
		run("ip", "-n", fx.NetNS, "addr", "add", "192.168.77.1/24", "dev", "rwforeign0")
		run("ip", "netns", "exec", fx.NetNS, "sysctl", "-qw", "net.ipv4.conf.rwforeign0.forwarding=1")
		before := run("ip", "-n", fx.NetNS, "-o", "addr", "show", "dev", "rwforeign0")
		dir := GinkgoT().TempDir()
		cfg := filepath.Join(dir, "cpi.json")
		b, _ := json.Marshal(map[string]any{"driver": "local", "state_dir": filepath.Join(dir, "state"),
			"local": map[string]any{"isolation": "container", "container": map[string]any{"bridge": "rwforeign0", "cidr": "10.250.10.0/24"}}})
		Expect(os.WriteFile(cfg, b, 0o600)).To(Succeed())
		sc := asString(runWith(cfg, request("create_stemcell", 2, fx.Image, map[string]any{})).Result)
		DeferCleanup(func() { runWith(cfg, request("delete_stemcell", 2, sc)) })
		r := runWith(cfg, request("create_vm", 2, "agent-f", sc, fx.VMProps, dynamic, []string{}, map[string]any{}))
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Message).To(ContainSubstring("container.bridge: interface rwforeign0 exists and is not the bridge of this state dir"))
		Expect(run("ip", "-n", fx.NetNS, "-o", "addr", "show", "dev", "rwforeign0")).To(Equal(before))
		Expect(run("ip", "netns", "exec", fx.NetNS, "sysctl", "-n", "net.ipv4.conf.rwforeign0.forwarding")).To(Equal("1\n"))
		Expect(run("ip", "netns", "exec", fx.NetNS, "iptables", "-S")).NotTo(ContainSubstring("rwforeign0"))
	})

	It("refuses a stemcell whose entries reach out of the image, and leaves the host as it was", func() {
		host := GinkgoT().TempDir()
		Expect(os.Chmod(host, 0o700)).To(Succeed())
		var buf strings.Builder
		tw := tar.NewWriter(&buf)
		Expect(tw.WriteHeader(&tar.Header{Name: "evil", Typeflag: tar.TypeSymlink, Linkname: host})).To(Succeed())
		Expect(tw.WriteHeader(&tar.Header{Name: "evil", Typeflag: tar.TypeDir, Mode: 0o3777})).To(Succeed())
		Expect(tw.Close()).To(Succeed())
		img := filepath.Join(GinkgoT().TempDir(), "evil.tar")
		Expect(os.WriteFile(img, []byte(buf.String()), 0o600)).To(Succeed())
		r := runRaw(request("create_stemcell", 2, img, map[string]any{}))
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Message).To(ContainSubstring(`lies on or below symlink "evil"`))
		fi, err := os.Stat(host)
		Expect(err).NotTo(HaveOccurred())
		Expect(fi.Mode().Perm()).To(Equal(os.FileMode(0o700)))
		Expect(fi.Mode() & (os.ModeSetgid | os.ModeSticky)).To(BeZero())
	})

	It("refuses container mode by name when the firewall cannot be set (no iptables)", func() {
		runc, err := exec.LookPath("runc")
		Expect(err).NotTo(HaveOccurred())
		dir := GinkgoT().TempDir()
		cfg := filepath.Join(dir, "cpi.json")
		b, _ := json.Marshal(map[string]any{"driver": "local", "state_dir": filepath.Join(dir, "state"),
			"local": map[string]any{"isolation": "container", "container": map[string]any{"runtime": runc, "bridge": "rwnofw0", "cidr": "10.250.11.0/24"}}})
		Expect(os.WriteFile(cfg, b, 0o600)).To(Succeed())
		cmd := exec.Command(cpiBin, "-configPath", cfg)
		cmd.Env = []string{"PATH=" + dir} // nothing there: no iptables
		cmd.Stdin = strings.NewReader(request("has_vm", 2, "vm-1"))
		out, err := cmd.Output()
		Expect(err).NotTo(HaveOccurred())
		Expect(string(out)).To(ContainSubstring(`needs iptables for the firewall`))
	})

	It("OOM-kills a VM at its memory limit and says so on its console", func() {
		cid, _ := vm(map[string]any{"ram": 48, "command": "echo allocating; exec dd if=/dev/zero of=/dev/null bs=256M count=1"}, dynamic)
		Eventually(console(cid), "20s", "50ms").Should(ContainSubstring("out-of-memory killer at its memory limit of 48 MiB"))
		// Its PID 1 was the one killed: SIGKILL, as a shell reports it.
		Eventually(func() string {
			b, _ := os.ReadFile(filepath.Join(vmDir(cid), "exit_status"))
			return string(b)
		}, "10s", "50ms").Should(Equal("137\n"))
	})

	It("attaches a disk into the running VM, detaches it, and keeps its data for the next VM", func() {
		writer := "until d=$(ls /warden-cpi-dev) && [ -n \"$d\" ] && echo data-from-vm > /warden-cpi-dev/$d/file; do sleep 0.05; done 2>/dev/null; echo wrote-$d; " +
			"while [ -n \"$(ls /warden-cpi-dev)\" ]; do sleep 0.05; done; echo detached; " +
			"trap 'exit 0' TERM; while :; do sleep 600 & wait $!; done"
		a, _ := vm(map[string]any{"command": writer}, dynamic)
		disk := asString(call("create_disk", 16, map[string]any{}, a))
		DeferCleanup(func() { cleanUp("delete_disk", disk) })
		var hint map[string]string
		Expect(json.Unmarshal(call("attach_disk", a, disk), &hint)).To(Succeed())
		Expect(hint["path"]).To(Equal("/warden-cpi-dev/" + disk))
		Eventually(console(a), "10s", "20ms").Should(ContainSubstring("wrote-" + disk))
		b, err := os.ReadFile(inVM(a, filepath.Join("devs", disk, "file")))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(b)).To(Equal("data-from-vm\n"))
		settings, err := os.ReadFile(filepath.Join(vmRoot(a), "var/vcap/bosh/warden-cpi-agent-env.json"))
		if err == nil { // only when the caller gave settings
			Expect(string(settings)).To(ContainSubstring(`"` + disk + `":"/warden-cpi-dev/` + disk + `"`))
		}

		call("detach_disk", a, disk)
		Eventually(console(a), "10s", "20ms").Should(ContainSubstring("detached"))
		call("delete_vm", a)

		reader := "until cat /warden-cpi-dev/*/file 2>/dev/null; do sleep 0.05; done; " +
			"trap 'exit 0' TERM; while :; do sleep 600 & wait $!; done"
		c, _ := vm(map[string]any{"command": reader}, dynamic)
		call("attach_disk", c, disk)
		Eventually(console(c), "10s", "20ms").Should(ContainSubstring("data-from-vm"))
		call("delete_vm", c) // detaches: the disk outlives it
		Expect(extimage.ReadFile(diskImage(disk), "/file")).To(Equal([]byte("data-from-vm\n")))
	})

	It("starts a VM again after the host restarted (its processes and mounts gone), with its disk", func() {
		cid, _ := vm(map[string]any{"command": "echo boot; ls /warden-cpi-dev; trap 'exit 0' TERM; while :; do sleep 600 & wait $!; done"}, dynamic)
		disk := asString(call("create_disk", 16, map[string]any{}, cid))
		DeferCleanup(func() { cleanUp("delete_disk", disk) })
		call("attach_disk", cid, disk)
		Eventually(console(cid), "10s", "20ms").Should(ContainSubstring("boot"))

		// What a restart takes away: the supervisor, the container, the mounts.
		b, err := os.ReadFile(filepath.Join(vmDir(cid), "pgid"))
		Expect(err).NotTo(HaveOccurred())
		run("kill", "-9", "--", "-"+strings.TrimSpace(string(b)))
		run("runc", "--root", filepath.Join(fx.StateDir, "runtime"), "delete", "--force", "runway-"+instanceKey(fx.StateDir)+"-"+cid)
		// The VM's mounts live in its supervisor's namespace: they went
		// with it.
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		Expect(string(mi)).NotTo(ContainSubstring(vmDir(cid)))
		Expect(string(mi)).NotTo(ContainSubstring(vmRun(cid)))

		call("reboot_vm", cid)
		Eventually(func() string { return strings.TrimSpace(console(cid)()) }, "10s", "20ms").Should(
			And(MatchRegexp(`boot(.|\n)*boot`), HaveSuffix(disk)), "booted again, seeing its disk")
		call("detach_disk", cid, disk)
	})

	It("keeps VMs to the host, or with container.nat lets them out masqueraded; never lets anything beyond the host in", func() {
		// Beyond the host: another namespace behind a veth, with a route
		// back to the VM networks, and the host forwarding (as a router
		// or a Docker host does).
		up := fmt.Sprintf("rwup%d", os.Getpid())
		run("ip", "netns", "add", up)
		DeferCleanup(func() { run("ip", "netns", "del", up) })
		run("ip", "-n", fx.NetNS, "link", "add", "upl0", "type", "veth", "peer", "name", "upl1", "netns", up)
		run("ip", "-n", fx.NetNS, "addr", "add", "172.31.250.1/30", "dev", "upl0")
		run("ip", "-n", fx.NetNS, "link", "set", "upl0", "up")
		run("ip", "-n", up, "addr", "add", "172.31.250.2/30", "dev", "upl1")
		run("ip", "-n", up, "link", "set", "upl1", "up")
		run("ip", "-n", up, "route", "add", "10.250.0.0/16", "via", "172.31.250.1")
		// Turned on after the bridge exists, forwarding is on for the
		// bridge too (as when Docker starts after Runway): only the
		// driver's firewall rules stand between.
		vm(fx.VMProps, dynamic)
		run("ip", "netns", "exec", fx.NetNS, "sysctl", "-qw", "net.ipv4.ip_forward=1")
		Expect(run("ip", "netns", "exec", fx.NetNS, "sysctl", "-n", "net.ipv4.conf.rwit0.forwarding")).To(Equal("1\n"))

		// A server beyond the host that names who connected.
		var peers = make(chan string, 8)
		ln := listenIn(up, "172.31.250.2:0")
		DeferCleanup(ln.Close)
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				peers <- c.RemoteAddr().(*net.TCPAddr).IP.String()
				fmt.Fprintf(c, "hello from beyond\n")
				c.Close()
			}
		}()
		dial := "busybox nc -w 3 " + strings.Replace(ln.Addr().String(), ":", " ", 1) + " </dev/null || echo dial-failed; " +
			"trap 'exit 0' TERM; while :; do sleep 600 & wait $!; done"

		closed, ip := vm(map[string]any{"command": "busybox httpd -p 8080 -h /; " + dial}, dynamic)
		Eventually(console(closed), "15s", "50ms").Should(ContainSubstring("dial-failed"))
		Expect(console(closed)()).NotTo(ContainSubstring("hello from beyond"))
		Expect(peers).To(BeEmpty())
		// Its web server answers the host, and nothing beyond it.
		Eventually(func() (string, error) { return httpGet(ip+":8080", "/etc/hostname") }, "10s", "50ms").ShouldNot(BeEmpty())
		Expect(dialFrom(up, ip+":8080")).To(HaveOccurred())

		// The same with container.nat, on its own bridge and state dir.
		nat := newOwnDriver(map[string]any{"bridge": "rwnat0", "cidr": "10.250.8.0/24", "nat": true})
		natVM, natIP := nat.vm("busybox httpd -p 8080 -h /; " + dial)
		natConsole := nat.console(natVM)
		Eventually(natConsole, "15s", "50ms").Should(ContainSubstring("hello from beyond"))
		Expect(<-peers).To(Equal("172.31.250.1"), "the VM's connection is masqueraded as the host's")
		// Out, not in: the VM's web server is closed to what lies beyond.
		Expect(dialFrom(up, natIP+":8080")).To(HaveOccurred())
		Eventually(func() (string, error) { return httpGet(natIP+":8080", "/etc/hostname") }, "10s", "50ms").ShouldNot(BeEmpty())
	})

	It("runs garm's instances as containers, through garm's provider protocol", func() {
		garm := func(command, instance string, stdin []byte) string {
			argv := append(append([]string{}, fx.Exec...), cpiBin)
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "GARM_COMMAND=" + command, "GARM_CONTROLLER_ID=ctl-c",
				"GARM_POOL_ID=pool-c", "GARM_PROVIDER_CONFIG_FILE=" + fx.ConfigPath, "GARM_INSTANCE_ID=" + instance}
			cmd.Stdin = strings.NewReader(string(stdin))
			out, err := cmd.Output()
			ExpectWithOffset(1, err).NotTo(HaveOccurred(), "%s: %s", command, out)
			return string(out)
		}
		userData := "#!/bin/sh\necho garm-instance-up $(hostname)\ntrap 'exit 0' TERM; while :; do sleep 600 & wait $!; done\n"
		bi, _ := json.Marshal(map[string]any{"name": "garm-c1", "pool_id": "pool-c", "os_type": "linux", "os_arch": "amd64",
			"flavor": "small", "image": "debian", "labels": []string{"runway"},
			"extra_specs": map[string]any{"stemcell": stemcell, "user_data": userData}})
		var inst struct {
			ProviderID string `json:"provider_id"`
			Status     string `json:"status"`
			Addresses  []struct {
				Address string `json:"address"`
			} `json:"addresses"`
		}
		Expect(json.Unmarshal([]byte(garm("CreateInstance", "", bi)), &inst)).To(Succeed())
		Expect(inst.Status).To(Equal("running"))
		Expect(inst.Addresses).NotTo(BeEmpty())
		Expect(inst.Addresses[0].Address).To(HavePrefix("10.250."))
		Eventually(console(inst.ProviderID), "10s", "20ms").Should(ContainSubstring("garm-instance-up " + inst.ProviderID))
		Expect(garm("GetInstance", "garm-c1", nil)).To(ContainSubstring(`"status":"running"`))
		garm("DeleteInstance", "garm-c1", nil)
		Expect(asBool(call("has_vm", inst.ProviderID))).To(BeFalse())
	})

	It("leaves nothing the next delete cannot remove when bin/cpi is killed at any point", func() {
		const trials = 20
		for i := range trials {
			req := request("create_vm", 2, "agent-k", stemcell, fx.VMProps, dynamic, []string{}, map[string]any{})
			argv := append(append([]string{}, fx.Exec...), cpiBin, "-configPath", fx.ConfigPath)
			cmd := exec.Command(argv[0], argv[1:]...)
			cmd.Env = directorEnv()
			cmd.Stdin = strings.NewReader(req)
			Expect(cmd.Start()).To(Succeed())
			// Spread the kills over create_vm's whole run (~100 ms here).
			time.Sleep(time.Duration(i*150/trials) * time.Millisecond)
			_ = cmd.Process.Signal(os.Kill)
			_ = cmd.Wait()
			// Kill a delete part-way too, every other trial.
			entries, _ := os.ReadDir(filepath.Join(fx.StateDir, "vms"))
			for _, e := range entries {
				if strings.HasPrefix(e.Name(), ".") {
					continue
				}
				if i%2 == 1 {
					argv := append(append([]string{}, fx.Exec...), cpiBin, "-configPath", fx.ConfigPath)
					d := exec.Command(argv[0], argv[1:]...)
					d.Env = directorEnv()
					d.Stdin = strings.NewReader(request("delete_vm", 2, e.Name()))
					Expect(d.Start()).To(Succeed())
					time.Sleep(time.Duration(rand.IntN(60)) * time.Millisecond)
					_ = d.Process.Signal(os.Kill)
					_ = d.Wait()
				}
				r := runRaw(request("delete_vm", 2, e.Name()))
				if r.Error != nil {
					Expect(r.Error.Type).To(Equal("Bosh::Clouds::VMNotFound"), r.Error.Message)
				}
			}
		}
		// A sweep runs with every delete: one more for what the last left.
		runRaw(request("delete_vm", 2, "vm-00000000-0000-0000-0000-000000000000"))
		for _, vm := range made { // the disk spec deleted its own
			if r := runRaw(request("delete_vm", 2, vm)); r.Error != nil {
				Expect(r.Error.Type).To(Equal("Bosh::Clouds::VMNotFound"), r.Error.Message)
			}
		}
		made = nil
		expectNothingLeft()
	})
})
