package local

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/runway-cpi/runway/src/driver"
)

func TestWithAddressesFillsTheNetworksTheVMGot(t *testing.T) {
	in := []byte(`{"agent_id":"a","networks":{"default":{"type":"dynamic","dns":["1.1.1.1"]}}}`)
	out := withAddresses(in, driver.Networks{"default": {Type: "dynamic", IP: "10.244.0.9", Netmask: "255.255.0.0", Gateway: "10.244.0.1"}})
	var m struct {
		AgentID  string                    `json:"agent_id"`
		Networks map[string]map[string]any `json:"networks"`
	}
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatal(err)
	}
	n := m.Networks["default"]
	if m.AgentID != "a" || n["ip"] != "10.244.0.9" || n["gateway"] != "10.244.0.1" || n["dns"] == nil {
		t.Errorf("settings after: %s", out)
	}
	if got := withAddresses([]byte(`"not an object"`), driver.Networks{}); string(got) != `"not an object"` {
		t.Errorf("non-object settings changed: %s", got)
	}
}

func TestUsableAddresses(t *testing.T) {
	d := &Driver{prefix: netip.MustParsePrefix("10.250.0.0/22")}
	for ip, ok := range map[string]bool{"10.250.1.77": true, "10.250.0.2": true, "10.250.3.254": true,
		"10.250.0.0": false, "10.250.0.1": false, "10.250.3.255": false, "10.251.0.5": false, "192.168.0.1": false} {
		if err := d.usable(netip.MustParseAddr(ip)); (err == nil) != ok {
			t.Errorf("%s: usable=%v, err %v", ip, ok, err)
		}
	}
}

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/tmp/a\040b/c\134d`); got != `/tmp/a b/c\d` {
		t.Errorf("got %q", got)
	}
}

func TestOCISpecHoldsTheVMAndNothingOfTheHost(t *testing.T) {
	t.Setenv("RUNWAY_TEST_HOST_SECRET", "s3cret")
	d := &Driver{root: "/var/lib/runway", cfg: Config{Container: ContainerConfig{PidsLimit: 100}}}
	c := d.ctr("vm-1")
	s := d.ociSpec(c, vmRecord{CID: "vm-1", AgentID: "ag"}, vmProps{RAM: 512, CPU: 2, Env: map[string]string{"A": "b", envMarker: "spoof"}}, []string{"/bin/true"})
	if s.Hostname != "vm-1" || s.Root.Path != c.rootfs() || s.Linux.RootfsPropagation != "rslave" {
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
	for _, want := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.NetworkNamespace, specs.IPCNamespace, specs.UTSNamespace, specs.MountNamespace} {
		if !slices.Contains(ns, want) {
			t.Errorf("no %s namespace", want)
		}
	}
	if len(s.Process.Capabilities.Bounding) != 3 || !s.Process.NoNewPrivileges {
		t.Errorf("capabilities %v, no_new_privileges %v", s.Process.Capabilities.Bounding, s.Process.NoNewPrivileges)
	}
	env := strings.Join(s.Process.Env, "\n")
	if strings.Contains(env, "s3cret") || strings.Contains(env, "spoof") || strings.Contains(env, d.root) || !strings.Contains(env, "A=b") {
		t.Errorf("environment:\n%s", env)
	}
	for _, m := range s.Mounts {
		if m.Type == "bind" && m.Source != c.devs() {
			t.Errorf("a host path is bound into the vm: %s", m.Source)
		}
	}
}

func TestUntarRootfsKeepsOwnersModesAndHardLinks(t *testing.T) {
	// Another owner takes root (as container mode does); otherwise one's own.
	owner := os.Getuid()
	if owner == 0 {
		owner = 1000
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h *tar.Header, body string) {
		h.Size = int64(len(body))
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(body))
	}
	add(&tar.Header{Name: "./tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}, "")
	add(&tar.Header{Name: "./usr/bin/su", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: os.Getuid(), Gid: os.Getgid()}, "su")
	add(&tar.Header{Name: "./home/u/f", Typeflag: tar.TypeReg, Mode: 0o640, Uid: owner, Gid: owner}, "f")
	add(&tar.Header{Name: "./usr/bin/su2", Typeflag: tar.TypeLink, Linkname: "./usr/bin/su"}, "")
	add(&tar.Header{Name: "./dev/null", Typeflag: tar.TypeChar, Mode: 0o666, Devmajor: 1, Devminor: 3}, "")
	tw.Close()
	dir := t.TempDir()
	src := filepath.Join(dir, "rootfs.tar")
	os.WriteFile(src, buf.Bytes(), 0o600)
	budget := &spaceBudget{room: 1 << 30}
	dst := filepath.Join(dir, "root")
	if err := untar(context.Background(), src, dst, budget, true); err != nil {
		t.Fatal(err)
	}
	st := func(p string) (os.FileInfo, *syscall.Stat_t) {
		fi, err := os.Lstat(filepath.Join(dst, p))
		if err != nil {
			t.Fatal(err)
		}
		return fi, fi.Sys().(*syscall.Stat_t)
	}
	if fi, _ := st("tmp"); fi.Mode()&os.ModeSticky == 0 || fi.Mode().Perm() != 0o777 {
		t.Errorf("/tmp mode %v", fi.Mode())
	}
	if fi, _ := st("usr/bin/su"); fi.Mode()&os.ModeSetuid == 0 {
		t.Errorf("su mode %v", fi.Mode())
	}
	if _, s := st("home/u/f"); int(s.Uid) != owner || int(s.Gid) != owner {
		t.Errorf("owner %d:%d", s.Uid, s.Gid)
	}
	_, a := st("usr/bin/su")
	_, b := st("usr/bin/su2")
	if a.Ino != b.Ino {
		t.Error("hard link unpacked as a copy")
	}
	if _, err := os.Lstat(filepath.Join(dst, "dev/null")); err == nil {
		t.Error("a device node was made (the runtime makes /dev)")
	}
	// Outside rootfs mode a device is refused, as before.
	if err := untar(context.Background(), src, filepath.Join(dir, "plain"), &spaceBudget{room: 1 << 30}, false); err == nil {
		t.Error("a device entry was accepted for a plain image")
	}
}

func TestUntarRefusesHardLinksOutOfTheImage(t *testing.T) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "evil", Typeflag: tar.TypeLink, Linkname: "../../etc/shadow"})
	tw.Close()
	dir := t.TempDir()
	src := filepath.Join(dir, "x.tar")
	os.WriteFile(src, buf.Bytes(), 0o600)
	err := untar(context.Background(), src, filepath.Join(dir, "out"), &spaceBudget{room: 1 << 30}, true)
	if err == nil || !strings.Contains(err.Error(), "escapes") {
		t.Errorf("err = %v", err)
	}
}
