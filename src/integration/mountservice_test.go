package integration_test

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/runway-cpi/runway/src/driver/local/mountsvc"
	"github.com/runway-cpi/runway/src/testkit/extimage"
	"github.com/runway-cpi/runway/src/testkit/hostile"
)

// A stemcell whose agent mounts its persistent disks itself
// (persistent_disks: mount_service, as scripts/stemcell-dev makes): the
// VM's mount(8) reaches the host's mount service through mount.ext4.
var _ = describeContainer("a stemcell whose agent mounts its own disks", Ordered, func() {
	var stemcell string
	BeforeAll(func() { stemcell = boshStemcell(map[string]any{"persistent_disks": "mount_service"}) })

	// bosh-agent's MountPersistentDisk, then MigratePersistentDisk
	// (platform/linux_platform.go) with its linuxMounter's checks
	// (platform/disk/linux_mounter.go: shouldMount, Remount) over
	// /proc/mounts, as the agent runs them without BindMountPersistentDisk.
	It("lets the agent migrate its data to a new disk: mount it, copy, move it to /var/vcap/store", func() {
		vm, _ := createVM(stemcell, map[string]any{"bosh_agent": true, "command": []string{"/bin/bash", "-c", migrateScript}}, dynamic)
		old := asString(call("create_disk", 16, map[string]any{}, vm))
		nu := asString(call("create_disk", 32, map[string]any{}, vm))
		DeferCleanup(func() {
			cleanUp("delete_vm", vm)
			cleanUp("delete_disk", old)
			cleanUp("delete_disk", nu)
		})
		call("attach_disk", vm, old)
		Eventually(console(vm), "20s", "50ms").Should(ContainSubstring("MOUNTED /warden-cpi-dev/" + old + "\n"))
		call("attach_disk", vm, nu)
		Eventually(console(vm), "20s", "50ms").Should(ContainSubstring("UNMOUNTED"))
		out := console(vm)()
		Expect(out).To(ContainSubstring("MIGRATED kept /warden-cpi-dev/"+nu+" 1 ro\n"), out)
		Expect(out).NotTo(ContainSubstring("FAILED"))
		Expect(out).NotTo(ContainSubstring("ELSEWHERE"))
		call("detach_disk", vm, old)
		call("detach_disk", vm, nu)
		b, err := extimage.ReadFile(diskImage(nu), "/kept")
		Expect(err).NotTo(HaveOccurred())
		Expect(string(b)).To(Equal("kept\n"))
	})

	// The VM as the attacker: its users, another VM's disk, a path that
	// is no disk, links out of its root, options the host does not give.
	It("mounts only the VM's own attached disks, for its root, inside its root, nosuid and nodev", func() {
		other, _ := createVM(stemcell, map[string]any{"bosh_agent": true, "command": []string{"sleep", "infinity"}}, dynamic)
		theirs := asString(call("create_disk", 16, map[string]any{}, other))
		DeferCleanup(func() {
			cleanUp("delete_vm", other)
			cleanUp("delete_disk", theirs)
		})
		call("attach_disk", other, theirs)
		vm, _ := createVM(stemcell, map[string]any{"bosh_agent": true, "command": []string{"/bin/bash", "-c", "THEIRS=" + theirs + "\n" + hostileMountScript}}, dynamic)
		mine := asString(call("create_disk", 16, map[string]any{}, vm))
		DeferCleanup(func() {
			cleanUp("delete_vm", vm)
			cleanUp("delete_disk", mine)
		})
		call("attach_disk", vm, mine)
		Eventually(console(vm), "30s", "50ms").Should(ContainSubstring("HOSTILE-DONE"))
		out := console(vm)()
		for _, want := range []string{
			`as vcap: .*connect: permission denied`,
			`their disk: .*disk ` + theirs + ` is not attached to this vm`,
			`no disk: .*a disk attached to this vm is /warden-cpi-dev/<disk>`,
			`magic link: .*target /proc/1/root/mnt: too many levels of symbolic links`,
			`remount: .*mount option "remount"`,
			`fs option: .*mount option "data=journal"`,
			`contained /escaped /warden-cpi-dev/` + mine + ` nosuid,nodev`,
		} {
			Expect(out).To(MatchRegexp(`(?m)^`+want), out)
		}
		Expect(out).NotTo(ContainSubstring("MOUNTED-THEIRS"))
		// The host's view: nothing of the VM's requests is mounted in the
		// host's namespace, and their disk has no mount in this VM.
		mi, err := os.ReadFile("/proc/self/mountinfo")
		Expect(err).NotTo(HaveOccurred())
		Expect(string(mi)).NotTo(ContainSubstring("/warden-cpi-dev/"))
		Expect(strings.Count(out, "/warden-cpi-dev/"+theirs+" ")).To(Equal(0))
	})
	// The VM's other users as the attacker (issue 45): uid 1000 holding
	// connections to the service pushed root's mount from 0.06 s to
	// 58.6 s; root's mounts through the service stacked without bound.
	It("serves its root at once while another user floods the service; noatime; stacked mounts bounded; no host path in its mount table", func() {
		vm, _ := createVM(stemcell, map[string]any{"bosh_agent": true, "command": []string{"sleep", "infinity"}}, dynamic)
		disk := asString(call("create_disk", 16, map[string]any{}, vm))
		DeferCleanup(func() {
			cleanUp("delete_vm", vm)
			cleanUp("delete_disk", disk)
		})
		call("attach_disk", vm, disk)
		probe, err := hostile.Probe()
		Expect(err).NotTo(HaveOccurred())
		b, err := os.ReadFile(probe)
		Expect(err).NotTo(HaveOccurred())
		Expect(os.WriteFile(filepath.Join(vmRoot(vm), "var/vcap/bosh/bin/vmprobe"), b, 0o755)).To(Succeed())

		flood := exec.Command("nsenter", vmNS(vm, "setpriv", "--reuid=1000", "--regid=1000", "--clear-groups",
			"/var/vcap/bosh/bin/vmprobe", "flood", "/warden-cpi-dev/mount.sock")...)
		out, err := flood.StdoutPipe()
		Expect(err).NotTo(HaveOccurred())
		stop, err := flood.StdinPipe()
		Expect(err).NotTo(HaveOccurred())
		Expect(flood.Start()).To(Succeed())
		DeferCleanup(func() { _ = flood.Process.Kill(); _ = flood.Wait() })
		lines := bufio.NewReader(out)
		up, err := lines.ReadString('\n')
		Expect(err).NotTo(HaveOccurred())
		Expect(up).To(HavePrefix("FLOOD-UP"))

		start := time.Now()
		got := vmExec(vm, "mkdir -p /mnt/a && mount -o noatime /warden-cpi-dev/"+disk+" /mnt/a && grep ' /mnt/a ' /proc/mounts")
		// Served before a flooding connection could have reached its
		// deadline: none held the service.
		Expect(time.Since(start)).To(BeNumerically("<", mountsvc.Deadline), "root waited for the flood")
		Expect(got).To(ContainSubstring("noatime"))
		// The socket is root's: the other user cannot even connect.
		Expect(up).To(ContainSubstring("connected=0"))
		Expect(up).To(ContainSubstring("permission denied"))
		Expect(stop.Close()).To(Succeed())
		end, _ := lines.ReadString('\n')
		Expect(end).To(MatchRegexp(`FLOOD-END connected=0 dropped=0 refused=\d+`))

		// Stacking mounts through the service stops at its bound, and
		// the kernel counts the mounts to the VM's memory (the VM idles:
		// its shell here is the host's nsenter, in the host's cgroups).
		kmem := vmKernelMemory(vm)
		got = vmExec(vm, `for i in $(seq 40); do mount /warden-cpi-dev/`+disk+` /mnt/a 2>&1 || { echo "REFUSED-AT $i"; break; }; done; echo "MOUNTS $(grep -c ' /mnt/a ' /proc/mounts)"`)
		Expect(got).To(ContainSubstring("at most 32"))
		Expect(got).To(ContainSubstring("MOUNTS 32"))
		Expect(got).To(MatchRegexp(`REFUSED-AT (3[0-2]|[12]\d)\b`))
		Expect(vmKernelMemory(vm)-kmem).To(BeNumerically(">=", 8<<10), "31 mounts charged to the VM's memory cgroup")

		// Its mount table names no host path of its mount points.
		mi := vmExec(vm, "cat /proc/self/mountinfo")
		Expect(mi).NotTo(ContainSubstring(filepath.Dir(vmRun(vm))))
		Expect(mi).NotTo(ContainSubstring(strings.TrimPrefix(filepath.Dir(vmRun(vm)), "/run")))
		Expect(mi).NotTo(ContainSubstring(fx.StateDir))
		vmExec(vm, "umount -R /mnt/a || while umount /mnt/a 2>/dev/null; do :; done")
		call("detach_disk", vm, disk)
	})
})

// migrateScript is the agent's disk steps: the first disk mounted at
// /var/vcap/store and written; the second at the migration target; the
// old one mounted read-only again (Remount: unmount, mount -o ro), copied,
// unmounted; the new one moved (unmount, mount what /proc/mounts said was
// there, after checking, as the agent does, that nothing else has it).
// MIGRATED tells the data, the store's source, its number of mounts and
// whether the old disk was read-only during the copy.
const migrateScript = `
store=/var/vcap/store; mig=/var/vcap/store_migration_target; mkdir -p $store $mig
settings=/var/vcap/bosh/warden-cpi-agent-env.json
disks() { grep -o '/warden-cpi-dev/disk-[^"]*' $settings 2>/dev/null | sort -u; }
src_of() { awk -v m="$1" '$2 == m { s = $1 } END { print s }' /proc/mounts; }
elsewhere() { awk -v s="$1" -v m="$2" '$1 == s && $2 != m' /proc/mounts; }
until [ "$(disks | wc -l)" = 1 ]; do sleep 0.05; done; old=$(disks)
[ -z "$(elsewhere $old $store)" ] || echo ELSEWHERE
mount $old $store || echo MOUNT-FAILED
echo kept > $store/kept
echo "MOUNTED $(src_of $store)"
until [ "$(disks | wc -l)" = 2 ]; do sleep 0.05; done; new=$(disks | grep -vx "$old")
mount $new $mig || echo MIG-MOUNT-FAILED
p=$(src_of $store); umount $store && mount $p $store -o ro || echo RO-FAILED
ro=$(touch $store/x 2>/dev/null && echo rw || echo ro)
(tar -C $store --xattrs -cf - .) | (tar -C $mig --xattrs -xpf -) || echo COPY-FAILED
umount $store || echo UMOUNT-FAILED
p=$(src_of $mig)
[ -z "$(elsewhere $p $mig)" ] || echo ELSEWHERE
umount $mig && mount $p $store || echo REMOUNT-FAILED
echo "MIGRATED $(cat $store/kept) $(src_of $store) $(grep -c " $store " /proc/mounts) $ro"
umount $new && ! mountpoint -q $store && echo UNMOUNTED || echo UNMOUNT-BY-SOURCE-FAILED
sleep infinity
`

// hostileMountScript: the VM's requests the service must refuse, each
// answer on the console; then one it must grant, through a link that
// climbs out of the VM's root (it lands inside it). The helper is run
// directly where mount(8) would resolve the path itself first.
const hostileMountScript = `
settings=/var/vcap/bosh/warden-cpi-agent-env.json
until mine=$(grep -o '/warden-cpi-dev/disk-[^"]*' $settings 2>/dev/null | head -1) && [ -n "$mine" ]; do sleep 0.05; done
mkdir -p /mnt/a /escaped
try() { local what=$1; shift; echo "$what: $("$@" 2>&1)"; }
try "as vcap" setpriv --reuid=1000 --regid=1000 --clear-groups /sbin/mount.ext4 $mine /tmp
try "their disk" mount /warden-cpi-dev/$THEIRS /mnt/a && mountpoint -q /mnt/a && echo MOUNTED-THEIRS
try "no disk" mount /warden-cpi-dev/../../etc /mnt/a
try "magic link" /sbin/mount.ext4 $mine /proc/1/root/mnt
try "remount" /sbin/mount.ext4 $mine /mnt/a -o remount
try "fs option" mount $mine /mnt/a -o data=journal
ln -s ../../../../../../.. /tmp/up
/sbin/mount.ext4 $mine /tmp/up/escaped -o suid,dev || echo ESCAPE-MOUNT-FAILED
echo "contained $(awk '$1 == "'$mine'" { print $2, $1, "" }' /proc/mounts | head -1)$(grep " /escaped " /proc/mounts | grep -o 'nosuid,nodev' | head -1)"
echo HOSTILE-DONE
sleep infinity
`

// vmKernelMemory is the kernel memory charged to a VM's memory cgroup
// (cgroup v1's kmem counter, else v2's memory.stat kernel).
func vmKernelMemory(vm string) int64 {
	cg := "runway/" + instanceKey(fx.StateDir) + "-" + vm
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", cg, "memory.kmem.usage_in_bytes")); err == nil {
		n, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
		return n
	}
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup", cg, "memory.stat"))
	ExpectWithOffset(1, err).NotTo(HaveOccurred())
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "kernel "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	Fail("no kernel memory in " + cg + "'s memory.stat")
	return 0
}
