package integration_test

import (
	"encoding/json"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/runway-cpi/runway/src/testkit/agentprobe"
	"github.com/runway-cpi/runway/src/testkit/extimage"
)

// The agent profile on a warden-style stemcell (scripts/rootfs-dev bosh):
// a bosh_agent VM can do what a BOSH agent does at boot as root, and a
// default VM cannot.
var _ = describeContainer("a VM hosting a BOSH agent", Ordered, func() {
	var stemcell string
	BeforeAll(func() { stemcell = boshStemcell() })

	It("does as root what the agent and its jobs do, with a disk attached while it runs", func() {
		vm, _ := createVM(stemcell, map[string]any{"bosh_agent": true, "command": []string{"/bin/bash", "-c", agentprobe.Script}}, dynamic)
		DeferCleanup(func() { cleanUp("delete_vm", vm) })
		Eventually(console(vm), "20s", "50ms").Should(ContainSubstring("RUNSV-OK"))
		out := console(vm)()
		for _, s := range append(agentprobe.Steps, agentprobe.RemountSteps...) {
			Expect(out).To(ContainSubstring(s+"-OK"), "agent step %s:\n%s", s, out)
		}
		disk := asString(call("create_disk", 16, map[string]any{}, vm))
		DeferCleanup(func() { cleanUp("delete_disk", disk) })
		call("attach_disk", vm, disk)
		Eventually(console(vm), "20s", "50ms").Should(ContainSubstring("MONIT-OK"))
		Expect(console(vm)()).To(ContainSubstring("STORE-OK"))
		b, err := os.ReadFile(inVM(vm, filepath.Join("devs", disk, "from-agent")))
		Expect(err).NotTo(HaveOccurred())
		Expect(string(b)).To(Equal("kept\n"))
		call("delete_vm", vm) // the disk outlives the VM, with its data
		b, err = extimage.ReadFile(diskImage(disk), "/from-agent")
		Expect(err).NotTo(HaveOccurred())
		Expect(string(b)).To(Equal("kept\n"))
	})

	// The Director's enable_cpi_resize_disk: the agent unmounts
	// /warden-cpi-dev/<disk> (not its bind at /var/vcap/store), then
	// detach_disk, resize_disk, attach_disk, and the agent mounts it again.
	It("takes the agent's own bind of a disk with detach_disk, so resize_disk grows it and the next attach is its only mount", func() {
		vm, _ := createVM(stemcell, map[string]any{"bosh_agent": true, "command": []string{"/bin/bash", "-c", storeScript}}, dynamic)
		disk := asString(call("create_disk", 16, map[string]any{}, vm))
		DeferCleanup(func() { // the VM first: an attached disk is not deleted
			cleanUp("delete_vm", vm)
			cleanUp("delete_disk", disk)
		})
		call("attach_disk", vm, disk)
		Eventually(console(vm), "20s", "50ms").Should(ContainSubstring("BOUND"))
		call("detach_disk", vm, disk)
		Eventually(console(vm), "10s", "50ms").Should(ContainSubstring("UNBOUND"), "the agent's bind outlived detach_disk")
		call("resize_disk", disk, 64)
		call("attach_disk", vm, disk)
		Eventually(console(vm), "20s", "50ms").Should(MatchRegexp(`REBOUND kept (\d+) 1\n`))
		m := regexp.MustCompile(`REBOUND kept (\d+) 1`).FindStringSubmatch(console(vm)())
		size, _ := strconv.Atoi(m[1])
		Expect(size).To(BeNumerically(">", 40), "the file system inside is the grown one (MiB)")
	})

	It("keeps a disk a VM holds open from being grown or mounted anywhere else until that VM lets it go", func() {
		holder, _ := createVM(stemcell, map[string]any{"bosh_agent": true, "command": []string{"/bin/bash", "-c", "HOLD=1\n" + storeScript}}, dynamic)
		other, _ := createVM(stemcell, map[string]any{"bosh_agent": true, "command": []string{"sleep", "infinity"}}, dynamic)
		disk := asString(call("create_disk", 16, map[string]any{}, holder))
		DeferCleanup(func() {
			cleanUp("delete_vm", holder)
			cleanUp("delete_vm", other)
			cleanUp("delete_disk", disk)
		})
		call("attach_disk", holder, disk)
		Eventually(console(holder), "20s", "50ms").Should(ContainSubstring("BOUND"))
		call("detach_disk", holder, disk) // as a volume is detached by force
		Eventually(console(holder), "10s", "50ms").Should(ContainSubstring("UNBOUND"))
		r := runRaw(request("resize_disk", 2, disk, 64))
		Expect(r.Error).NotTo(BeNil(), "grown under a live mount")
		Expect(r.Error.Message).To(ContainSubstring("cannot grow: disk " + disk + " is still held by vm " + holder))
		r = runRaw(request("attach_disk", 2, other, disk))
		Expect(r.Error).NotTo(BeNil(), "mounted in a second VM while the first still holds it")
		Expect(r.Error.Message).To(ContainSubstring("is still held by vm " + holder))
		call("delete_vm", holder)
		call("resize_disk", disk, 64)
		b, err := extimage.ReadFile(diskImage(disk), "/kept")
		Expect(err).NotTo(HaveOccurred())
		Expect(string(b)).To(Equal("kept\n"))
	})

	It("refuses those steps to a default VM", func() {
		vm, _ := createVM(stemcell, map[string]any{"command": []string{"/bin/bash", "-c", agentprobe.Script}}, dynamic)
		DeferCleanup(func() { cleanUp("delete_vm", vm) })
		Eventually(console(vm), "20s", "50ms").Should(ContainSubstring("probe-init"))
		out := console(vm)()
		for _, s := range append(agentprobe.Steps, agentprobe.RemountSteps...) {
			Expect(out).To(ContainSubstring(s+"-FAIL"), "agent step %s in a default VM:\n%s", s, out)
		}
	})

	It("starts the stemcell's runsvdir when the VM has no command, with the settings an agent in a container expects", func() {
		manual := map[string]any{"default": map[string]any{"type": "manual", "ip": "10.250.1.90", "netmask": "255.255.255.0",
			"gateway": "10.250.0.1", "dns": []string{"10.250.0.1", "8.8.8.8"}, "default": []string{"dns", "gateway"}}}
		r := runRaw(request("create_vm", 2, "agent-b", stemcell, map[string]any{"bosh_agent": true}, manual, []string{}, map[string]any{}))
		// The manifest's subnet (/24 around .90) must hold the host's .1.
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Message).To(ContainSubstring("does not hold the host's address 10.250.0.1"))
		manual["default"].(map[string]any)["ip"] = "10.250.0.90"
		var res []json.RawMessage
		Expect(json.Unmarshal(call("create_vm", "agent-b", stemcell, map[string]any{"bosh_agent": true}, manual, []string{}, map[string]any{}), &res)).To(Succeed())
		vm := asString(res[0])
		DeferCleanup(func() { cleanUp("delete_vm", vm) })
		root := vmRoot(vm)
		// PID 1 is runsvdir over /etc/service: the agent's service runs
		// (it waits for a binary in this stemcell).
		Eventually(func() string {
			b, _ := os.ReadFile(filepath.Join(root, "etc/sv/agent/supervise/stat"))
			return string(b)
		}, "15s", "50ms").Should(Equal("run\n"))
		var settings struct {
			Networks map[string]struct {
				IP            string `json:"ip"`
				Netmask       string `json:"netmask"`
				Gateway       string `json:"gateway"`
				Preconfigured bool   `json:"preconfigured"`
			} `json:"networks"`
		}
		b, err := os.ReadFile(filepath.Join(root, "var/vcap/bosh/warden-cpi-agent-env.json"))
		Expect(err).NotTo(HaveOccurred())
		Expect(json.Unmarshal(b, &settings)).To(Succeed())
		n := settings.Networks["default"]
		Expect(n.IP).To(Equal("10.250.0.90"))
		Expect(n.Netmask).To(Equal("255.255.255.0"), "the manifest's netmask is kept")
		Expect(n.Gateway).To(Equal("10.250.0.1"))
		Expect(n.Preconfigured).To(BeTrue())
		rc, err := os.ReadFile(filepath.Join(root, "etc/resolv.conf"))
		Expect(err).NotTo(HaveOccurred())
		Expect(strings.Fields(string(rc))).To(Equal([]string{"nameserver", "10.250.0.1", "nameserver", "8.8.8.8"}))
	})

	It("refuses a VM with nothing to run on a stemcell without runsvdir-start, naming what it looked for", func() {
		plain := asString(call("create_stemcell", fx.Image, map[string]any{}))
		DeferCleanup(func() { cleanUp("delete_stemcell", plain) })
		r := runRaw(request("create_vm", 2, "agent-x", plain, map[string]any{}, dynamic, []string{}, map[string]any{}))
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Message).To(ContainSubstring("has no /usr/sbin/runsvdir-start to start its agent"))
	})
})

// storeScript does in a VM what the BOSH agent does with its persistent
// disk on a warden stemcell: bind /warden-cpi-dev/<disk> at
// /var/vcap/store and write there; it says when the bind is gone and, the
// disk back, binds it again and tells the data, the file system's size
// (MiB) and how many mounts /var/vcap/store has. HOLD=1 keeps a file open
// on the disk, as a job that was not stopped would.
const storeScript = `
store=/var/vcap/store; mkdir -p $store
wait_disk() { until d=$(ls -d /warden-cpi-dev/disk-* 2>/dev/null | head -1) && mountpoint -q "$d"; do sleep 0.05; done; }
wait_disk
mount --bind "$d" $store && echo kept > $store/kept || echo BIND-FAILED
[ "${HOLD:-}" = 1 ] && exec 3<$store/kept
echo BOUND
while mountpoint -q $store; do sleep 0.05; done
echo UNBOUND
wait_disk
mount --bind "$d" $store || echo BIND-FAILED
echo "REBOUND $(cat $store/kept) $(df -m --output=size $store | tail -1 | tr -d ' ') $(grep -c " $store " /proc/mounts)"
sleep infinity
`

// boshStemcell uploads the bosh rootfs (scripts/rootfs-dev path bosh) as
// a warden stemcell (with further cloud_properties) for the rest of the
// container, deleted after it.
func boshStemcell(props ...map[string]any) string {
	image := os.Getenv("RUNWAY_TEST_BOSH_ROOTFS")
	ExpectWithOffset(1, image).NotTo(BeEmpty(), "RUNWAY_TEST_BOSH_ROOTFS must name the bosh rootfs (scripts/rootfs-dev path bosh)")
	cp := map[string]any{"infrastructure": "warden", "hypervisor": "boshlite"}
	for _, p := range props {
		maps.Copy(cp, p)
	}
	stemcell := asString(call("create_stemcell", image, cp))
	DeferCleanup(func() { cleanUp("delete_stemcell", stemcell) })
	return stemcell
}
