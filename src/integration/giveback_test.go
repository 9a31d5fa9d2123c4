package integration_test

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/runway-cpi/runway/src/testkit/extimage"
)

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
					runRaw(request("delete_vm", 2, vm))
					runRaw(request("delete_disk", 2, disk))
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
				DeferCleanup(func() { runRaw(request("delete_vm", 2, other)) })
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
	sum := sha256.Sum256([]byte(fx.StateDir))
	procs, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids/runway", hex.EncodeToString(sum[:4])+"-"+vm, "cgroup.procs"))
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
