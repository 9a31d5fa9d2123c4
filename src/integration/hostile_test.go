package integration_test

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/testkit/extimage"
	"github.com/runway-cpi/runway/src/testkit/hostile"
)

// The attacker's side (issue 37): each spec's VM runs an attack as its
// own command, made through bin/cpi as the Director makes VMs, and the
// host is then checked for what the attack was after. The image holds
// busybox and vmprobe (src/testkit/hostile).

// hostileDriver is a container-mode driver of its own whose stemcell is
// the hostile image.
type hostileDriver struct {
	*ownDriver
	key string // the state dir's key in cgroup and container names
}

func newHostileDriver(container map[string]any) *hostileDriver {
	return newHostileDriverWith(container, nil)
}

// newHostileDriverWith is newHostileDriver with more local keys.
func newHostileDriverWith(container, local map[string]any) *hostileDriver {
	return newHostileDriverAt(filepath.Join(GinkgoT().TempDir(), "state"), container, local)
}

// newHostileDriverAt is newHostileDriverWith with its state in dir state.
func newHostileDriverAt(state string, container, local map[string]any) *hostileDriver {
	img, err := hostile.Image(GinkgoT().TempDir())
	Expect(err).NotTo(HaveOccurred())
	o := newOwnDriverAt(state, img, container, local)
	return &hostileDriver{ownDriver: o, key: instanceKey(o.state)}
}

// vmWith makes a VM with cloud properties props (and a dynamic network).
func (h *hostileDriver) vmWith(props map[string]any) string {
	var res []json.RawMessage
	ExpectWithOffset(1, json.Unmarshal(h.call("create_vm", "agent-hostile", h.sc, props, dynamic, []string{}, map[string]any{}), &res)).To(Succeed())
	cid := asString(res[0])
	DeferCleanup(func() {
		if r := h.raw("delete_vm", cid); r.Error != nil {
			Expect(r.Error.Type).To(Equal("Bosh::Clouds::VMNotFound"), r.Error.Message)
		}
	})
	return cid
}

// address is a VM's address on the bridge (from the driver's record).
func (h *hostileDriver) address(cid string) string {
	var rec struct {
		Networks map[string]struct {
			IP string `json:"ip"`
		} `json:"networks"`
	}
	b, err := os.ReadFile(filepath.Join(h.state, "vms", cid, "vm.json"))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	ExpectWithOffset(1, json.Unmarshal(b, &rec)).To(Succeed())
	return rec.Networks["default"].IP
}

// cgroupFile is a file of the VM's cgroup under a v1 controller, on the host.
func (h *hostileDriver) cgroupFile(controller, cid, file string) string {
	return filepath.Join("/sys/fs/cgroup", controller, "runway", h.key+"-"+cid, file)
}

func readTrim(path string) string {
	b, err := os.ReadFile(path)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return strings.TrimSpace(string(b))
}

// idle ends a hostile script: PID 1 waits for SIGTERM.
const idle = "; echo PROBE-END; trap 'exit 0' TERM; while :; do sleep 600 & wait $!; done"

var _ = describeContainer("a hostile VM", Ordered, func() {
	It("with the agent profile, reaches nothing of the host or other VMs through cgroups, /proc, /sys or keys", func() {
		h := newHostileDriver(map[string]any{"bridge": "rwhost0", "cidr": "10.250.20.0/24", "bosh_agent": true})
		n := rand.Int64()
		// A key of the host's root stands for another VM's and the host's
		// keyrings (the default seccomp profile keeps VMs from adding keys).
		keyDesc := fmt.Sprintf("runway-victim-%d", n)
		key, err := unix.AddKey("user", keyDesc, []byte("the host's secret"), unix.KEY_SPEC_USER_KEYRING)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { _, _ = unix.KeyctlInt(unix.KEYCTL_REVOKE, key, 0, 0, 0) })
		victim := h.vmWith(map[string]any{"command": "echo victim-up" + idle})
		Eventually(h.console(victim), "15s", "50ms").Should(ContainSubstring("victim-up"))

		// What the host must still hold afterwards.
		const sysfsFile = "/sys/kernel/mm/ksm/sleep_millisecs"
		corePattern, sysfsValue := readTrim("/proc/sys/kernel/core_pattern"), readTrim(sysfsFile)
		DeferCleanup(func() {
			_ = os.WriteFile("/proc/sys/kernel/core_pattern", []byte(corePattern), 0o644)
			_ = os.WriteFile(sysfsFile, []byte(sysfsValue), 0o644)
			_ = os.WriteFile(h.cgroupFile("freezer", victim, "freezer.state"), []byte("THAWED"), 0o644)
		})
		mark := filepath.Join(os.TempDir(), fmt.Sprintf("runway-hostile-%d", n))
		DeferCleanup(func() { os.Remove(mark) })
		victimCG := "/runway/" + h.key + "-" + victim

		script := strings.Join([]string{
			`report() { if [ "$2" = 0 ]; then echo "$1-BROKE"; else echo "$1-HELD"; fi; }`,
			// The host path of the VM's writable layer: a script there is a
			// host path to execute, if anything on the host runs it.
			`U=$(sed -n 's/.*upperdir=\([^,]*\).*/\1/p' /proc/mounts | head -1)`,
			`printf '#!/bin/sh\ntouch ` + mark + `\n' > /evil.sh; chmod +x /evil.sh`,
			// The cgroup v1 release_agent of a named hierarchy it mounts.
			`(mkdir -p /cg1 && mount -t cgroup -o none,name=rwevil cgroup /cg1 && mkdir -p /cg1/x && echo 1 > /cg1/x/notify_on_release && echo "$U/evil.sh" > /cg1/release_agent && sh -c 'echo $$ > /cg1/x/cgroup.procs') 2>/dev/null; report RELEASE-AGENT $?`,
			// core_pattern, with /proc/sys unmasked and rw.
			`(umount /proc/sys; mount -o remount,rw /proc/sys; echo "|$U/evil.sh" > /proc/sys/kernel/core_pattern) 2>/dev/null; report CORE-PATTERN $?`,
			// A host tunable under /sys, remounted rw.
			`(mount -o remount,rw /sys; echo 4242 > ` + sysfsFile + `) 2>/dev/null; report SYSFS $?`,
			// Another VM's key, with /proc/keys unmasked.
			`umount /proc/keys 2>/dev/null; grep -q ` + keyDesc + ` /proc/keys; report KEYS $?`,
			// Its own memory limit, and the host's root pids cgroup.
			`cg=$(sed -n 's/^[0-9]*:memory:\(.*\)/\1/p' /proc/self/cgroup)`,
			`(mkdir -p /cgm && mount -t cgroup -o memory cgroup /cgm && { echo -1 > /cgm$cg/memory.memsw.limit_in_bytes; echo -1 > /cgm$cg/memory.limit_in_bytes; }) 2>/dev/null; report MEMLIMIT $?`,
			`(mkdir -p /cgp && mount -t cgroup -o pids cgroup /cgp && echo $$ > /cgp/cgroup.procs) 2>/dev/null; report PIDS $?`,
			// Another VM frozen.
			`(mkdir -p /cgf && mount -t cgroup -o freezer cgroup /cgf && echo FROZEN > /cgf` + victimCG + `/freezer.state) 2>/dev/null; report FREEZE $?`,
		}, "\n") + idle
		attacker := h.vmWith(map[string]any{"bosh_agent": true, "ram": 256, "command": []string{"/bin/sh", "-c", script}})
		Eventually(h.console(attacker), "30s", "50ms").Should(ContainSubstring("PROBE-END"))
		out := h.console(attacker)()
		for _, attack := range []string{"RELEASE-AGENT", "CORE-PATTERN", "SYSFS", "KEYS", "MEMLIMIT", "FREEZE"} {
			Expect(out).To(ContainSubstring(attack+"-HELD"), "attack %s:\n%s", attack, out)
		}
		Expect(readTrim("/proc/sys/kernel/core_pattern")).To(Equal(corePattern))
		Expect(readTrim(sysfsFile)).To(Equal(sysfsValue))
		Expect(mark).NotTo(BeAnExistingFile(), "the release agent ran on the host")
		Expect(readTrim(h.cgroupFile("memory", attacker, "memory.limit_in_bytes"))).To(Equal(fmt.Sprint(256 << 20)))
		Expect(readTrim(h.cgroupFile("freezer", victim, "freezer.state"))).To(Equal("THAWED"))
		// Every process of the attacker is still in its own pids cgroup.
		procs := readTrim(h.cgroupFile("pids", attacker, "cgroup.procs"))
		Expect(procs).NotTo(BeEmpty())
		rootProcs, err := os.ReadFile("/sys/fs/cgroup/pids/cgroup.procs")
		Expect(err).NotTo(HaveOccurred())
		pid1 := readTrim(filepath.Join(h.state, "vms", attacker, "container.pid"))
		Expect(strings.Fields(string(rootProcs))).NotTo(ContainElement(pid1), "the VM's init moved into the host's root pids cgroup")
	})

	It("with the agent profile, cannot take another VM's address: its port sends only its own IP and MAC", func() {
		h := newHostileDriver(map[string]any{"bridge": "rwhost3", "cidr": "10.250.23.0/24", "bosh_agent": true, "allow_vm_to_vm": true})
		serve := func(name string) string {
			return "mkdir -p /www && echo " + name + " > /www/who && busybox httpd -p 8080 -h /www && " +
				"echo MAC=$(cat /sys/class/net/eth0/address)"
		}
		victim := h.vmWith(map[string]any{"command": serve("victim") + idle})
		Eventually(h.console(victim), "15s", "50ms").Should(ContainSubstring("PROBE-END"))
		victimIP, victimMAC := h.address(victim), strings.TrimPrefix(regexp.MustCompile(`MAC=\S+`).FindString(h.console(victim)()), "MAC=")
		Expect(victimMAC).NotTo(BeEmpty())
		who := func() (string, error) { return httpGet(victimIP+":8080", "/who") }
		Eventually(who, "10s", "50ms").Should(HaveSuffix("victim\n"))
		// The attacker wears the victim's address and hardware address,
		// then talks to the host: the host learns the victim's address
		// from its ARP request.
		attack := strings.Join([]string{
			serve("attacker"),
			"ip link set eth0 down; ip link set eth0 address " + victimMAC + "; ip link set eth0 up",
			"ip addr flush dev eth0; ip addr add " + victimIP + "/24 dev eth0; ip route add default via 10.250.23.1",
			"for i in 1 2 3 4 5; do busybox nc -w 1 10.250.23.1 9 </dev/null; done; echo SPOOFED",
		}, "; ") + idle
		attacker := h.vmWith(map[string]any{"bosh_agent": true, "command": []string{"/bin/sh", "-c", attack}})
		Eventually(h.console(attacker), "30s", "50ms").Should(ContainSubstring("PROBE-END"))
		Expect(h.console(attacker)()).To(ContainSubstring("SPOOFED"))
		for range 5 {
			Expect(who()).To(HaveSuffix("victim\n"), "the host's traffic for the victim reached the attacker")
		}
		neigh := run("ip", "-n", fx.NetNS, "neigh", "show", victimIP)
		Expect(neigh).To(ContainSubstring(victimMAC), "the host's neighbour entry for the victim")
	})

	It("writing forever stops at its writable layer's and its disk's sizes; every call still works, and deleting it frees the space", func() {
		// The state dir on a small file system of its own: a VM filling it
		// would stop the driver's own writes.
		state := filepath.Join(GinkgoT().TempDir(), "state")
		Expect(os.Mkdir(state, 0o700)).To(Succeed())
		run("mount", "-t", "tmpfs", "-o", "size=384m", "tmpfs", state)
		DeferCleanup(func() { run("umount", "-l", state) })
		free := func() int64 {
			var st unix.Statfs_t
			Expect(unix.Statfs(state, &st)).To(Succeed())
			return int64(st.Bavail) * st.Bsize
		}
		h := newHostileDriverAt(state, map[string]any{"bridge": "rwhost7", "cidr": "10.250.27.0/24"}, nil)
		disk := asString(h.call("create_disk", 32, map[string]any{}, nil))
		DeferCleanup(func() { h.call("delete_disk", disk) })
		fills := "vmprobe fill /big; until [ -d /warden-cpi-dev/" + disk + " ]; do sleep 0.1; done; " +
			"vmprobe fill /warden-cpi-dev/" + disk + "/big; echo FILLS-DONE"
		vm := h.vmWith(map[string]any{"ephemeral_disk_size": 32, "command": []string{"/bin/sh", "-c", fills + idle}})
		stopped := regexp.MustCompile(`FILL-STOPPED (\d+) (.*)`)
		Eventually(h.console(vm), "60s", "50ms").Should(MatchRegexp(`FILL-STOPPED \d+`))
		h.call("attach_disk", vm, disk)
		Eventually(h.console(vm), "60s", "50ms").Should(ContainSubstring("PROBE-END"))
		var inLayer int64 // what the first fill (/big, the layer) wrote
		for i, m := range stopped.FindAllStringSubmatch(h.console(vm)(), -1) {
			n, _ := strconv.ParseInt(m[1], 10, 64)
			if i == 0 {
				inLayer = n
			}
			Expect(n).To(BeNumerically("<=", 32<<20), "written past 32 MiB: %s", m[0])
			Expect(m[2]).To(ContainSubstring("no space left on device"))
		}
		Expect(stopped.FindAllString(h.console(vm)(), -1)).To(HaveLen(2))
		// The driver still writes what it must.
		other := h.vmWith(map[string]any{"ephemeral_disk_size": 32, "command": "echo other-up" + idle})
		h.call("set_vm_metadata", other, map[string]any{"name": "other"})
		h.call("delete_disk", asString(h.call("create_disk", 16, map[string]any{}, nil)))
		h.call("delete_vm", other)
		h.call("detach_disk", vm, disk)
		// Measured after the detach: unmounting the full disk writes its
		// journal into blocks of the sparse image not yet allocated (up
		// to ~2 MiB, whenever the kernel commits), which is not the layer.
		before := free()
		h.call("delete_vm", vm)
		// The kernel lets go of a deleted layer's loop device a moment after
		// its last mount (autoclear), and only then of the file's pages:
		// at least what the VM wrote there comes back (not the layer's
		// whole 32 MiB: blocks ext4 keeps for its root, which the VM's
		// root is not on the host, were never written).
		Expect(inLayer).To(BeNumerically(">", 16<<20), "the VM filled its layer")
		Eventually(free, "10s", "50ms").Should(BeNumerically(">=", before+inLayer), "deleting the vm gave back its writable layer")
	})

	It("cannot ask for more memory or CPUs than the operator allows (the host's own by default)", func() {
		h := newHostileDriver(map[string]any{"bridge": "rwhost5", "cidr": "10.250.25.0/24", "max_ram_mib": 512, "max_cpu": 1})
		for props, want := range map[string]map[string]any{
			"local.container.max_ram_mib: 512": {"ram": 1024, "command": "sleep 600"},
			"local.container.max_cpu: 1":       {"cpu": 2, "command": "sleep 600"},
		} {
			r := h.raw("create_vm", "agent-hostile", h.sc, want, dynamic, []string{}, map[string]any{})
			Expect(r.Error).NotTo(BeNil(), "a vm past %s was made", props)
			Expect(r.Error.Message).To(ContainSubstring(props))
		}
		byDefault := newHostileDriver(map[string]any{"bridge": "rwhost6", "cidr": "10.250.26.0/24"})
		r := byDefault.raw("create_vm", "agent-hostile", byDefault.sc, map[string]any{"ram": 1 << 30, "cpu": 1 << 20, "command": "sleep 600"}, dynamic, []string{}, map[string]any{})
		Expect(r.Error).NotTo(BeNil(), "a vm with 1 PiB of memory was made")
		Expect(r.Error.Message).To(ContainSubstring("local.container.max_ram_mib"))
		entries, _ := os.ReadDir(filepath.Join(h.state, "vms"))
		Expect(entries).To(BeEmpty(), "a refused VM left something")
	})

	It("cannot ask for the agent profile where the driver's config does not allow it", func() {
		h := newHostileDriver(map[string]any{"bridge": "rwhost2", "cidr": "10.250.22.0/24"})
		r := h.raw("create_vm", "agent-hostile", h.sc, map[string]any{"bosh_agent": true, "command": "sleep 600"}, dynamic, []string{}, map[string]any{})
		Expect(r.Error).NotTo(BeNil(), "an agent VM was made without the config allowing it")
		Expect(r.Error.Message).To(ContainSubstring("cloud_properties.bosh_agent"))
		Expect(r.Error.Message).To(ContainSubstring("local.container.bosh_agent"))
		entries, _ := os.ReadDir(filepath.Join(h.state, "vms"))
		Expect(entries).To(BeEmpty(), "the refused VM left something")
	})

	It("cannot make the host mount a disk over a host directory by planting a link where disks appear", func() {
		h := newHostileDriver(map[string]any{"bridge": "rwhost1", "cidr": "10.250.21.0/24"})
		target := GinkgoT().TempDir()
		Expect(os.WriteFile(filepath.Join(target, "host-file"), []byte("host"), 0o600)).To(Succeed())
		disk := asString(h.call("create_disk", 16, map[string]any{}, nil))
		DeferCleanup(func() { h.call("delete_disk", disk) })
		// The VM plants a link to the host directory where the disk
		// appeared, each time it is gone (after a detach).
		plant := `d=/warden-cpi-dev/` + disk + `; said=; while :; do ` +
			`if [ ! -e $d ] && [ ! -L $d ]; then if ln -s ` + target + ` $d 2>/dev/null; then echo PLANTED; else [ -n "$said" ] || echo PLANT-FAILED; said=1; fi; fi; ` +
			`sleep 0.05; done`
		vm := h.vmWith(map[string]any{"command": []string{"/bin/sh", "-c", plant}})
		h.call("attach_disk", vm, disk)
		h.call("detach_disk", vm, disk)
		Eventually(h.console(vm), "15s", "20ms").Should(Or(ContainSubstring("PLANTED"), ContainSubstring("PLANT-FAILED")))
		h.call("attach_disk", vm, disk)
		covered := func() bool {
			mi, _ := os.ReadFile("/proc/self/mountinfo")
			return strings.Contains(string(mi), " "+target+" ")
		}
		Expect(covered()).To(BeFalse(), "the host directory was covered by the disk")
		Expect(filepath.Join(target, "host-file")).To(BeAnExistingFile())
		h.call("detach_disk", vm, disk)
		h.call("delete_vm", vm)
		Expect(covered()).To(BeFalse(), "a mount over the host directory outlived the VM")
	})
})

// Two operators on one host, each with the default container.uid_base
// (issue 45): their VMs got the same host ids, and one VM using up its
// user's pipe buffers left the other operator's VM none (EPERM).
var _ = describeContainer("VMs of two state dirs", func() {
	It("share no host id: one using up its user's pipe buffers leaves the other its own", func() {
		a := newHostileDriver(map[string]any{"bridge": "rwhost8", "cidr": "10.250.28.0/24"})
		b := newHostileDriver(map[string]any{"bridge": "rwhost9", "cidr": "10.250.29.0/24"})
		hog := a.vmWith(map[string]any{"command": "vmprobe pipes 100000" + idle})
		Eventually(a.console(hog), "15s", "50ms").Should(MatchRegexp(`PIPES-HELD \d+ operation not permitted`))
		other := b.vmWith(map[string]any{"command": "vmprobe pipes 1" + idle})
		Eventually(b.console(other), "15s", "50ms").Should(ContainSubstring("PIPES-HELD"))
		Expect(b.console(other)()).To(ContainSubstring("PIPES-HELD 1 <nil>"))
		ra, rb := idRange(a.state, hog), idRange(b.state, other)
		Expect(ra[0]+ra[1] <= rb[0] || rb[0]+rb[1] <= ra[0]).To(BeTrue(), "id ranges %v and %v overlap", ra, rb)
	})
})

// idRange is a running VM's user namespace's host range: base, size.
func idRange(state, vm string) [2]uint64 {
	b, err := os.ReadFile(filepath.Join(state, "vms", vm, "container.pid"))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	m, err := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/uid_map")
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	f := strings.Fields(string(m))
	ExpectWithOffset(1, f).To(HaveLen(3), "one mapping")
	base, _ := strconv.ParseUint(f[1], 10, 64)
	size, _ := strconv.ParseUint(f[2], 10, 64)
	return [2]uint64{base, size}
}

var _ = describeContainer("a VM replacing where its settings go", func() {
	It("gets a clear error from reboot_vm, naming the link", func() {
		h := newHostileDriver(map[string]any{"bridge": "rwhost10", "cidr": "10.250.30.0/24"})
		vm := h.vmWith(map[string]any{"command": "rm -rf /var/vcap/bosh && ln -s /etc /var/vcap/bosh && echo REPLACED" + idle})
		Eventually(h.console(vm), "15s", "50ms").Should(ContainSubstring("REPLACED"))
		r := h.raw("reboot_vm", vm)
		Expect(r.Error).NotTo(BeNil(), "reboot_vm wrote through the VM's link")
		Expect(r.Error.Message).To(ContainSubstring(`/var/vcap/bosh in the vm is a link (to "/etc"), not a directory`))
	})
})

// consoleFlood writes 3 MiB to the console, fast, then says CONSOLE-END.
const consoleFlood = "yes 'runway console flood' | head -c 3145728; echo CONSOLE-END"

// expectConsoleCapped: the VM's console.log and console.log.1 each hold at
// most cap bytes, and the newest output is in console.log.
func expectConsoleCapped(vmDir string, cap int) {
	cur, err := os.ReadFile(filepath.Join(vmDir, "console.log"))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	old, err := os.ReadFile(filepath.Join(vmDir, "console.log.1"))
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "no rotated console.log.1")
	ExpectWithOffset(1, len(cur)).To(BeNumerically("<=", cap), "console.log")
	ExpectWithOffset(1, len(old)).To(BeNumerically("<=", cap), "console.log.1")
	ExpectWithOffset(1, string(cur)).To(ContainSubstring("CONSOLE-END"))
}

var _ = describeContainer("a VM flooding its console", func() {
	It("fills no more than its capped, rotated console.log", func() {
		h := newHostileDriverWith(map[string]any{"bridge": "rwhost4", "cidr": "10.250.24.0/24"}, map[string]any{"console_max_kib": 64})
		vm := h.vmWith(map[string]any{"command": consoleFlood + idle})
		Eventually(h.console(vm), "30s", "50ms").Should(ContainSubstring("PROBE-END"))
		expectConsoleCapped(filepath.Join(h.state, "vms", vm), 64<<10)
	})
})

var _ = describeLocal("a process VM flooding its console", func() {
	It("fills no more than its capped, rotated console.log", func() {
		dir := GinkgoT().TempDir()
		cfg := filepath.Join(dir, "cpi.json")
		b, _ := json.Marshal(map[string]any{"driver": "local", "state_dir": filepath.Join(dir, "state"),
			"local": map[string]any{"stop_grace_seconds": 1, "console_max_kib": 64}})
		Expect(os.WriteFile(cfg, b, 0o600)).To(Succeed())
		call := func(method string, args ...any) json.RawMessage {
			r := runWith(cfg, request(method, 2, args...))
			ExpectWithOffset(1, r.Error).To(BeNil(), "%s: %+v", method, r.Error)
			return r.Result
		}
		sc := asString(call("create_stemcell", fx.Image, map[string]any{}))
		DeferCleanup(func() { call("delete_stemcell", sc) })
		var res []json.RawMessage
		Expect(json.Unmarshal(call("create_vm", "agent-flood", sc, map[string]any{"command": consoleFlood + "; exec sleep 600"},
			map[string]any{}, []string{}, map[string]any{}), &res)).To(Succeed())
		vm := asString(res[0])
		DeferCleanup(func() { call("delete_vm", vm) })
		vmDir := filepath.Join(dir, "state", "vms", vm)
		Eventually(func() string { b, _ := os.ReadFile(filepath.Join(vmDir, "console.log")); return string(b) }, "30s", "50ms").Should(ContainSubstring("CONSOLE-END"))
		expectConsoleCapped(vmDir, 64<<10)
	})
})

// The VM as the attacker of a disk it must give back (issue 45): after
// its root mounted the disk, a process in a mount namespace of its own
// (private: the VM's init never sees its copy) and one holding a file
// open keep writing. detach_disk must leave the disk in none of the VM's
// mount namespaces and its writes must stop; delete_disk and
// snapshot_disk must not act on the disk while the VM still holds it.
var _ = describeContainer("a VM keeping a disk it gave back", func() {
	for _, mode := range []struct{ name, props, mount string }{
		{"whose agent mounts its disks (mount service)", "mount_service", `mount $disk $store`},
		{"whose agent binds its disks", "bind", `until mountpoint -q $disk; do sleep 0.05; done; mount --bind $disk $store`},
	} {
		Describe(mode.name, Ordered, func() {
			var stemcell string
			BeforeAll(func() { stemcell = boshStemcell(map[string]any{"persistent_disks": mode.props}) })

			It("loses it from every mount namespace at detach_disk; its writes stop, and the disk is kept whole and refused until the VM lets go", func() {
				vm, _ := createVM(stemcell, map[string]any{"bosh_agent": true, "command": []string{"/bin/bash", "-c",
					strings.Replace(keepDiskScript, "MOUNT", mode.mount, 1)}}, dynamic)
				disk := asString(call("create_disk", 16, map[string]any{}, vm))
				DeferCleanup(func() {
					cleanUp("delete_vm", vm)
					cleanUp("delete_disk", disk)
				})
				call("attach_disk", vm, disk)
				Eventually(console(vm), "30s", "50ms").Should(And(ContainSubstring("NESTED-OK 3\n"), ContainSubstring("OPEN-OK 3\n")))
				Expect(console(vm)()).NotTo(ContainSubstring("MOUNT-FAILED"))
				dev := loopDevice(diskImage(disk))
				Expect(vmMountsOf(vm, dev)).NotTo(BeEmpty(), "the VM's namespaces hold the disk before the detach")

				r := runRaw(request("detach_disk", 2, vm, disk))
				Expect(r.Error).To(BeNil())
				Expect(r.Log).To(ContainSubstring("still held the disk"), "the cut-off is said in the call's log")
				Expect(vmMountsOf(vm, dev)).To(BeEmpty(), "a namespace of the VM still mounts the disk")
				before := sha(diskImage(disk))
				// Each writer tries again and fails, and none succeeds after
				// its first failure.
				Eventually(console(vm), "10s", "50ms").Should(And(
					MatchRegexp(`NESTED-FAILED \d+\n(.*\n)*NESTED-FAILED \d+\n(.*\n)*NESTED-FAILED`),
					MatchRegexp(`OPEN-FAILED \d+\n(.*\n)*OPEN-FAILED \d+\n(.*\n)*OPEN-FAILED`)))
				out := console(vm)()
				for _, w := range []string{"NESTED", "OPEN"} {
					first := strings.Index(out, w+"-FAILED")
					Expect(out[first:]).NotTo(ContainSubstring(w+"-OK"), "%s wrote after it was cut off", w)
				}
				Expect(sha(diskImage(disk))).To(Equal(before), "the disk changed after detach_disk")

				// Held, the disk is neither deleted, copied nor attached.
				other, _ := createVM(stemcell, map[string]any{"bosh_agent": true, "command": []string{"sleep", "infinity"}}, dynamic)
				DeferCleanup(func() { cleanUp("delete_vm", other) })
				for _, try := range []Response{
					runRaw(request("delete_disk", 2, disk)),
					runRaw(request("snapshot_disk", 2, disk, map[string]any{})),
					runRaw(request("attach_disk", 2, other, disk)),
				} {
					Expect(try.Error).NotTo(BeNil())
					Expect(try.Error.Message).To(ContainSubstring("still held by vm " + vm))
				}
				Expect(diskImage(disk)).To(BeAnExistingFile())

				// Gone with the VM: every write acknowledged before the
				// cut-off is on the disk.
				call("delete_vm", vm)
				for _, w := range []string{"NESTED", "OPEN"} {
					last := lastOK(out, w)
					Expect(last).To(BeNumerically(">=", 3))
					b, err := extimage.ReadFile(diskImage(disk), "/"+strings.ToLower(w)+".log")
					Expect(err).NotTo(HaveOccurred())
					lines := strings.Fields(string(b))
					Expect(len(lines)).To(BeNumerically(">=", last), "%s's acknowledged writes", w)
					Expect(lines[last-1]).To(Equal(strconv.Itoa(last)))
				}
				call("attach_disk", other, disk)
				call("detach_disk", other, disk)
				call("delete_disk", disk)
			})
		})
	}
})

// keepDiskScript: the VM mounts its disk at /var/vcap/store (MOUNT), then
// two writers add a numbered line every 0.1 s and say whether it took:
// one in a private mount namespace of its own, from its working
// directory on the disk; one through a file it holds open.
const keepDiskScript = `
settings=/var/vcap/bosh/warden-cpi-agent-env.json
until disk=$(grep -o '/warden-cpi-dev/disk-[^"]*' $settings 2>/dev/null | head -1) && [ -n "$disk" ]; do sleep 0.05; done
store=/var/vcap/store; mkdir -p $store
MOUNT || echo MOUNT-FAILED
writer() {
  i=0; while :; do i=$((i+1)); if echo $i >&3 2>/dev/null; then echo "$1-OK $i"; else echo "$1-FAILED $i"; fi; sleep 0.1; done
}
unshare -m --propagation private /bin/bash -c "$(declare -f writer); cd $store && exec 3>>nested.log && writer NESTED" &
(exec 3>>$store/open.log; writer OPEN) &
trap 'exit 0' TERM; while :; do sleep 600 & wait $!; done
`

// loopDevice is the major:minor of the loop device holding image.
func loopDevice(image string) string {
	bound, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, b := range bound {
		if f, _ := os.ReadFile(b); strings.TrimSpace(string(f)) == image {
			dev, err := os.ReadFile(filepath.Join(filepath.Dir(filepath.Dir(b)), "dev"))
			ExpectWithOffset(1, err).NotTo(HaveOccurred())
			return strings.TrimSpace(string(dev))
		}
	}
	Fail("no loop device holds " + image)
	return ""
}

// vmMountsOf lists, for every process of the VM (its cgroup's), the
// mounts of device dev its mount namespace has.
func vmMountsOf(vm, dev string) []string {
	procs, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids/runway", instanceKey(fx.StateDir)+"-"+vm, "cgroup.procs"))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	var out []string
	for _, pid := range strings.Fields(string(procs)) {
		tasks, _ := filepath.Glob("/proc/" + pid + "/task/*")
		for _, t := range tasks {
			mi, _ := os.ReadFile(t + "/mountinfo")
			for _, line := range strings.Split(string(mi), "\n") {
				if f := strings.Fields(line); len(f) > 4 && f[2] == dev {
					out = append(out, fmt.Sprintf("%s: %s", t, f[4]))
				}
			}
		}
	}
	return out
}

func sha(path string) string {
	b, err := os.ReadFile(path)
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// lastOK is the number of writer w's last acknowledged write.
func lastOK(out, w string) int {
	m := regexp.MustCompile(w+`-OK (\d+)\n`).FindAllStringSubmatch(out, -1)
	if len(m) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(m[len(m)-1][1])
	return n
}
