package container

import (
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/runway-cpi/runway/src/driver/local/procs"
	"github.com/runway-cpi/runway/src/driver/local/storage"
)

func TestOCISpecHoldsTheVMAndNothingOfTheHost(t *testing.T) {
	t.Setenv("RUNWAY_TEST_HOST_SECRET", "s3cret")
	root, devs := "/var/lib/runway/vms/vm-1/rootfs", "/var/lib/runway/vms/vm-1/devs"
	s, err := Spec(VM{CID: "vm-1", AgentID: "ag", Rootfs: root, Devs: devs, Cgroup: "/runway/x-vm-1", RAMMiB: 512, CPU: 2, Pids: 100,
		Env: map[string]string{"A": "b", procs.EnvMarker: "spoof"}, Argv: []string{"/bin/true"}, IDs: storage.IDRange{Base: 1 << 30, Size: 1 << 16}})
	if err != nil {
		t.Fatal(err)
	}
	if s.Linux.Seccomp == nil || s.Linux.Seccomp.DefaultAction != specs.ActErrno || len(s.Linux.Seccomp.Syscalls) == 0 {
		t.Errorf("no default seccomp profile: %+v", s.Linux.Seccomp)
	}
	if s.Hostname != "vm-1" || s.Root.Path != root || s.Linux.RootfsPropagation != "rslave" {
		t.Errorf("hostname %q root %q propagation %q", s.Hostname, s.Root.Path, s.Linux.RootfsPropagation)
	}
	if got := *s.Linux.Resources.Memory.Limit; got != 512<<20 {
		t.Errorf("memory limit %d", got)
	}
	if *s.Linux.Resources.CPU.Quota != 200000 || *s.Linux.Resources.CPU.Period != 100000 {
		t.Errorf("cpu quota %d/%d", *s.Linux.Resources.CPU.Quota, *s.Linux.Resources.CPU.Period)
	}
	if s.Linux.Resources.Pids.Limit != 100 {
		t.Errorf("pids %d", s.Linux.Resources.Pids.Limit)
	}
	var ns []specs.LinuxNamespaceType
	for _, n := range s.Linux.Namespaces {
		ns = append(ns, n.Type)
	}
	for _, want := range []specs.LinuxNamespaceType{specs.UserNamespace, specs.PIDNamespace, specs.NetworkNamespace,
		specs.IPCNamespace, specs.UTSNamespace, specs.MountNamespace, specs.CgroupNamespace} {
		if !slices.Contains(ns, want) {
			t.Errorf("no %s namespace", want)
		}
	}
	// Root in the VM is host uid 2^30 (and the 65535 after it), never 0.
	want := []specs.LinuxIDMapping{{ContainerID: 0, HostID: 1 << 30, Size: 1 << 16}}
	if !slices.Equal(s.Linux.UIDMappings, want) || !slices.Equal(s.Linux.GIDMappings, want) {
		t.Errorf("id mappings %v %v", s.Linux.UIDMappings, s.Linux.GIDMappings)
	}
	if len(s.Process.Capabilities.Bounding) != 3 || !s.Process.NoNewPrivileges {
		t.Errorf("capabilities %v, no_new_privileges %v", s.Process.Capabilities.Bounding, s.Process.NoNewPrivileges)
	}
	env := strings.Join(s.Process.Env, "\n")
	if strings.Contains(env, "s3cret") || strings.Contains(env, "spoof") || strings.Contains(env, "/var/lib/runway") || !strings.Contains(env, "A=b") {
		t.Errorf("environment:\n%s", env)
	}
	for _, m := range s.Mounts {
		if m.Type == "bind" && m.Source != devs {
			t.Errorf("a host path is bound into the vm: %s", m.Source)
		}
	}
}
