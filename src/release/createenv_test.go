package release

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/runway-cpi/runway/src/testkit/extimage"
	"github.com/runway-cpi/runway/src/testkit/netns"
	"github.com/runway-cpi/runway/src/testkit/testenv"
)

// createEnvLifecycle installs the runway_cpi job as bosh-cli's create-env
// does — under an installation directory, found through
// BOSH_PACKAGES_DIR and BOSH_JOBS_DIR, the environment cleared but for
// them and PATH — configured for the local driver's container mode, and
// calls it in create-env's order (info before every call) in a network
// namespace of its own: the warden-style stemcell (scripts/rootfs-dev
// bosh), a VM with the agent profile on a static IP, a persistent disk
// attached while it runs, a recreate (delete_vm, create_vm, attach) that
// keeps the disk's data, then delete-env's calls: nothing may be left.
func createEnvLifecycle(t *testing.T, rel, vcap, work string) {
	image := testenv.Need(t, "scripts/rootfs-dev path bosh; scripts/test sets it", "RUNWAY_TEST_BOSH_ROOTFS")[0]
	if os.Geteuid() != 0 {
		t.Fatal("container mode needs root")
	}
	inst := filepath.Join(work, "installations", "c2e0b8a4")
	state := filepath.Join(work, "createenv-state")
	link(t, filepath.Join(vcap, "packages", "runway_cpi"), filepath.Join(inst, "packages", "runway_cpi"))
	src := filepath.Join(rel, "..", "jobs-createenv", "runway_cpi")
	untgz(t, filepath.Join(rel, "jobs", "runway_cpi.tgz"), src)
	job := filepath.Join(inst, "jobs", "runway_cpi")
	renderJobDir(t, src, map[string]any{
		"runway": map[string]any{"driver": "local", "state_dir": state, "local": map[string]any{"isolation": "container",
			"stop_grace_seconds": 2, "container": map[string]any{"bridge": "rwce0", "cidr": "10.244.0.0/16", "bosh_agent": true,
				"default_ephemeral_disk_mib": 256}}},
		"agent":     map[string]any{"mbus": "https://mbus:pw@0.0.0.0:6868"},
		"blobstore": map[string]any{"provider": "local", "path": "/var/vcap/micro_bosh/data/cache"},
	}, job)
	os.Chmod(filepath.Join(job, "bin", "cpi"), 0o755)

	ns := netns.Add(t, "rwce")

	// bosh-cli's CPI runner: the wrapper with the installation's
	// directories, no HOME; info first, then the method at min(info, 2).
	raw := func(method string, api int, args ...any) cpiResponse {
		t.Helper()
		if args == nil {
			args = []any{}
		}
		req, _ := json.Marshal(map[string]any{"method": method, "arguments": args, "api_version": api,
			"context": map[string]any{"director_uuid": "create-env", "vm": map[string]any{"stemcell": map[string]any{"api_version": 3}}}})
		cmd := exec.Command("nsenter", "--net=/run/netns/"+ns, "--", filepath.Join(job, "bin", "cpi"))
		cmd.Env = []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "BOSH_PACKAGES_DIR=" + filepath.Join(inst, "packages"),
			"BOSH_JOBS_DIR=" + filepath.Join(inst, "jobs")}
		cmd.Stdin = strings.NewReader(string(req))
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		var r cpiResponse
		if err := json.Unmarshal(out, &r); err != nil || r.Log == nil {
			t.Fatalf("%s: not a response: %s", method, out)
		}
		return r
	}
	call := func(method string, args ...any) json.RawMessage {
		t.Helper()
		var info struct {
			APIVersion int `json:"api_version"`
		}
		if r := raw("info", 1); r.Error != nil || json.Unmarshal(r.Result, &info) != nil || info.APIVersion < 2 {
			t.Fatalf("info before %s: %+v", method, r)
		}
		r := raw(method, min(info.APIVersion, 2), args...)
		if r.Error != nil {
			t.Fatalf("%s: %s: %s\n%s", method, r.Error.Type, r.Error.Message, *r.Log)
		}
		return r.Result
	}
	var stemcell, disk string
	decode(t, call("create_stemcell", image, map[string]any{"name": "bosh-warden-boshlite-debian-bookworm-go_agent", "version": "1.0",
		"infrastructure": "warden", "hypervisor": "boshlite", "disk": 5120, "disk_format": "files", "container_format": "bare",
		"os_type": "linux", "os_distro": "debian", "architecture": "x86_64", "root_device_name": "/dev/sda1"}), &stemcell)
	net := map[string]any{"default": map[string]any{"type": "manual", "ip": "10.244.0.10", "netmask": "255.255.255.0",
		"gateway": "10.244.0.1", "dns": []string{"8.8.8.8"}, "default": []string{"dns", "gateway"}, "cloud_properties": map[string]any{}}}
	env := map[string]any{"bosh": map[string]any{"mbus": map[string]any{"cert": map[string]any{"ca": "ca"}}, "password": "*",
		"blobstores": []any{map[string]any{"provider": "local", "options": map[string]any{"blobstore_path": "/var/vcap/micro_bosh/data/cache"}}}}}
	createVM := func() string {
		var res []json.RawMessage
		decode(t, call("create_vm", "agent-ce", stemcell, map[string]any{"bosh_agent": true}, net, []string{}, env), &res)
		var vm string
		decode(t, res[0], &vm)
		call("set_vm_metadata", vm, map[string]any{"director": "bosh-init", "deployment": "webapp-env", "job": "webapp",
			"instance_group": "webapp", "index": "0", "name": "webapp/0", "created_at": time.Now().UTC().Format(time.RFC3339)})
		return vm
	}
	vm := createVM()
	settings := func(vm string) string {
		return readFile(t, inVM(t, state, vm, "rootfs/var/vcap/bosh/warden-cpi-agent-env.json"))
	}
	if s := settings(vm); !strings.Contains(s, `"blobstore_path":"/var/vcap/micro_bosh/data/cache"`) || !strings.Contains(s, `"preconfigured":true`) ||
		!strings.Contains(s, `"mbus":"https://mbus:pw@0.0.0.0:6868"`) {
		t.Errorf("agent settings: %s", s)
	}
	decode(t, call("create_disk", 1024, map[string]any{}, vm), &disk)
	call("attach_disk", vm, disk)
	// create-env --recreate: the disk goes with the new VM.
	call("detach_disk", vm, disk)
	// What the agent would have written to /var/vcap/store.
	if err := extimage.WriteFile(filepath.Join(state, "disks", disk, "disk.img"), "/kept", []byte("data\n")); err != nil {
		t.Fatal(err)
	}
	call("delete_vm", vm)
	vm = createVM()
	call("attach_disk", vm, disk)
	if s := settings(vm); !strings.Contains(s, `"`+disk+`":"/warden-cpi-dev/`+disk+`"`) {
		t.Errorf("the recreated VM's settings do not name its disk: %s", s)
	}
	if got := readFile(t, inVM(t, state, vm, filepath.Join("devs", disk, "kept"))); got != "data\n" {
		t.Errorf("the disk's data in the recreated VM: %q", got)
	}
	// delete-env.
	call("delete_vm", vm)
	call("delete_disk", disk)
	call("delete_stemcell", stemcell)
	for _, k := range []string{"vms", "disks", "stemcells", "runtime"} {
		if left, _ := os.ReadDir(filepath.Join(state, k)); len(left) > 0 {
			t.Errorf("delete-env left %s: %v", k, left)
		}
	}
	if mi, _ := os.ReadFile("/proc/self/mountinfo"); strings.Contains(string(mi), state) {
		t.Errorf("delete-env left mounts under %s", state)
	}
	if out, _ := exec.Command("ip", "-n", ns, "-o", "link").Output(); regexp.MustCompile(`\d+: rw[0-9a-f]{12}@`).Match(out) {
		t.Errorf("veths left: %s", out)
	}
}

// inVM is a path among a running container VM's mount points, reached
// through its supervisor's root (the local driver mounts a VM's file
// systems in its supervisor's mount namespace).
func inVM(t *testing.T, state, vm, path string) string {
	t.Helper()
	sum := sha256.Sum256([]byte(state))
	pgid := strings.TrimSpace(readFile(t, filepath.Join(state, "vms", vm, "pgid")))
	return filepath.Join("/proc", pgid, "root", "run/runway", hex.EncodeToString(sum[:4]), vm, path)
}
