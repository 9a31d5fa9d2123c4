package integration_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("the full lifecycle, as the Director drives it", Ordered, func() {
	var stemcell, vmV1, vm, disk, snapshot string

	AfterAll(func() {
		// Leave nothing behind even when a step failed half-way.
		for _, v := range []string{vm, vmV1} {
			if v != "" {
				cleanUp("delete_vm", v)
			}
		}
		if disk != "" {
			cleanUp("delete_disk", disk)
		}
		if stemcell != "" {
			cleanUp("delete_stemcell", stemcell)
		}
	})

	It("info reports API v3 and the driver's stemcell formats to every caller", func() {
		// 0: the Director's first call (no api_version); 1: bosh-cli always.
		for _, api := range []int{0, 1, 2, 3} {
			var info struct {
				APIVersion      *int     `json:"api_version"`
				StemcellFormats []string `json:"stemcell_formats"`
			}
			Expect(json.Unmarshal(callV(api, "info"), &info)).To(Succeed())
			Expect(info.APIVersion).NotTo(BeNil(), "info at api_version %d", api)
			Expect(*info.APIVersion).To(Equal(3))
			Expect(info.StemcellFormats).NotTo(BeEmpty())
		}
	})

	It("create_stemcell accepts the v3 env argument", func() {
		stemcell = asString(callV(3, "create_stemcell", fx.Image, fx.ImageProps, map[string]any{"tags": map[string]string{"suite": "lifecycle"}}))
		Expect(stemcell).NotTo(BeEmpty())
	})

	It("create_vm at API v1 answers a bare cid", func() {
		vmV1 = asString(callV(1, "create_vm", "agent-v1", stemcell, fx.VMProps, networks(), []string{}, map[string]any{}))
		Expect(asBool(call("has_vm", vmV1))).To(BeTrue())
	})

	It("create_vm at API v2 answers [cid, networks] with addresses", func() {
		var res []json.RawMessage
		Expect(json.Unmarshal(call("create_vm", "agent-v2", stemcell, fx.VMProps, networks(), []string{},
			map[string]any{"bosh": map[string]any{"group": "it"}}), &res)).To(Succeed())
		Expect(res).To(HaveLen(2))
		vm = asString(res[0])
		var nets map[string]struct {
			IP string `json:"ip"`
		}
		Expect(json.Unmarshal(res[1], &nets)).To(Succeed())
		for name := range fx.Networks {
			Expect(nets[name].IP).NotTo(BeEmpty(), "network %s", name)
		}
	})

	It("has_vm finds it", func() {
		Expect(asBool(call("has_vm", vm))).To(BeTrue())
	})

	It("set_vm_metadata takes the Director's metadata", func() {
		call("set_vm_metadata", vm, map[string]string{"director": "it", "deployment": "dep", "instance_group": "web",
			"job": "web", "id": "abc", "name": "web/abc", "index": "0", "created_at": "2026-11-21T00:00:00Z"})
	})

	It("create_disk, attach_disk (non-empty hint), get_disks", func() {
		disk = asString(call("create_disk", 1024, fx.DiskProps, vm))
		Expect(asBool(call("has_disk", disk))).To(BeTrue())
		call("set_disk_metadata", disk, map[string]string{"deployment": "dep"})
		hint := call("attach_disk", vm, disk)
		Expect(string(hint)).NotTo(BeElementOf("null", `""`, "{}"))
		var disks []string
		Expect(json.Unmarshal(call("get_disks", vm), &disks)).To(Succeed())
		Expect(disks).To(Equal([]string{disk}))
	})

	It("snapshot_disk and delete_snapshot", func() {
		if fx.NoSnapshots {
			callErr("Bosh::Clouds::NotImplemented", "snapshot_disk", disk, map[string]string{"deployment": "dep"})
			return
		}
		snapshot = asString(call("snapshot_disk", disk, map[string]string{"deployment": "dep"}))
		Expect(snapshot).NotTo(BeEmpty())
		call("delete_snapshot", snapshot)
	})

	It("detach_disk, then detaching again is DiskNotAttached", func() {
		call("detach_disk", vm, disk)
		callErr("Bosh::Clouds::DiskNotAttached", "detach_disk", vm, disk)
		var disks []string
		Expect(json.Unmarshal(call("get_disks", vm), &disks)).To(Succeed())
		Expect(disks).To(BeEmpty())
	})

	It("resize_disk grows and refuses to shrink with NotSupported", func() {
		call("resize_disk", disk, 2048)
		callErr("Bosh::Clouds::NotSupported", "resize_disk", disk, 1024)
	})

	It("delete_disk, then again is DiskNotFound", func() {
		call("delete_disk", disk)
		Expect(asBool(call("has_disk", disk))).To(BeFalse())
		callErr("Bosh::Clouds::DiskNotFound", "delete_disk", disk)
		disk = ""
	})

	It("reboot_vm keeps the vm", func() {
		call("reboot_vm", vm)
		Expect(asBool(call("has_vm", vm))).To(BeTrue())
	})

	It("delete_vm, then again is VMNotFound", func() {
		for _, v := range []string{vm, vmV1} {
			call("delete_vm", v)
			Expect(asBool(call("has_vm", v))).To(BeFalse())
			callErr("Bosh::Clouds::VMNotFound", "delete_vm", v)
		}
		vm, vmV1 = "", ""
	})

	It("delete_stemcell, and again without error", func() {
		call("delete_stemcell", stemcell)
		call("delete_stemcell", stemcell)
		stemcell = ""
	})

	// Specs are registered for the drivers they apply to: no spec skips,
	// so a run that tested nothing cannot pass (docs/testing.md).
	itLocal("left nothing behind in the state dir", func() {
		for _, kind := range []string{"vms", "disks", "snapshots", "stemcells"} {
			entries, err := os.ReadDir(filepath.Join(fx.StateDir, kind))
			Expect(err).NotTo(HaveOccurred())
			Expect(entries).To(BeEmpty(), "%s\n%s", kind, cleanUpFailures())
		}
	})
})

var _ = Describe("error paths", func() {
	It("unknown cids answer the types the Director swallows", func() {
		callErr("Bosh::Clouds::VMNotFound", "delete_vm", fx.UnknownVM)
		callErr("Bosh::Clouds::VMNotFound", "reboot_vm", fx.UnknownVM)
		callErr("Bosh::Clouds::VMNotFound", "set_vm_metadata", fx.UnknownVM, map[string]string{"a": "b"})
		callErr("Bosh::Clouds::DiskNotFound", "delete_disk", fx.UnknownDisk)
		Expect(asBool(call("has_vm", fx.UnknownVM))).To(BeFalse())
		Expect(asBool(call("has_disk", fx.UnknownDisk))).To(BeFalse())
	})

	It("path-like cids are refused with a clear CpiError", func() {
		for _, cid := range []string{"../../etc", "a/b", ""} {
			r := callErr("Bosh::Clouds::CpiError", "has_vm", cid)
			Expect(r.Error.Message).To(ContainSubstring("vm cid"))
		}
	})

	It("malformed requests get a CpiError response and exit 0", func() {
		for _, in := range []string{"", "{", "[]", `{"method":"info"}`, `{"method":"info","arguments":[],"context":{}}`,
			`{"method":"info","arguments":[],"context":{"director_uuid":"d"},"api_version":"two"}`} {
			r := runRaw(in)
			Expect(r.Error).NotTo(BeNil(), "input %q", in)
			Expect(r.Error.Type).To(Equal("Bosh::Clouds::CpiError"), "input %q", in)
		}
	})

	It("wrong argument types name the method, position and type", func() {
		r := callErr("Bosh::Clouds::CpiError", "create_disk", "1024", map[string]any{}, nil)
		Expect(r.Error.Message).To(Equal("create_disk: argument 1 (disk_size) must be an integer, got a string"))
		r = callErr("Bosh::Clouds::CpiError", "attach_disk", fx.UnknownVM)
		Expect(r.Error.Message).To(Equal("attach_disk: expected 2 arguments (vm_cid, disk_cid), got 1"))
	})

	It("unknown methods are NotImplemented; deprecated ones answer as the Director expects", func() {
		r := callErr("Bosh::Clouds::NotImplemented", "make_coffee")
		Expect(r.Error.Message).To(Equal("Must call implemented method: make_coffee"))
		callErr("Bosh::Clouds::NotImplemented", "current_vm_id")
		callErr("Bosh::Clouds::NotSupported", "configure_networks", fx.UnknownVM, map[string]any{})
	})

	It("request_id is on every log line, in the response and on stderr", func() {
		r := runRaw(request("has_vm", 2, fx.UnknownVM))
		for _, out := range []string{r.Log, r.Stderr} {
			lines := strings.Split(strings.TrimSpace(out), "\n")
			Expect(lines).NotTo(BeEmpty())
			for _, l := range lines {
				Expect(l).To(ContainSubstring("[cpi-424242]"))
			}
		}
	})

	itCloud("an unreachable IaaS endpoint is a CloudError naming it, not a hang", func() {
		Expect(fx.UnreachableConfig).NotTo(BeEmpty(), "the fixture of a cloud driver names an unreachable config")
		r := runWith(fx.UnreachableConfig, request("has_vm", 2, fx.UnknownVM))
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Type).To(Equal("Bosh::Clouds::CloudError"))
		Expect(r.Error.Message).To(ContainSubstring(fx.UnreachableEndpoint))
	})

	itCloud("the driver's credentials never reach the response or stderr", func() {
		Expect(fx.Secret).NotTo(BeEmpty(), "the fixture of a cloud driver names its secret")
		for _, cfg := range []string{fx.ConfigPath, fx.UnreachableConfig} {
			r := runWith(cfg, request("has_vm", 2, fx.UnknownVM))
			Expect(r.Log + r.Stderr).NotTo(ContainSubstring(fx.Secret))
			if r.Error != nil {
				Expect(r.Error.Message).NotTo(ContainSubstring(fx.Secret))
			}
		}
	})

	It("a bad config file is a CpiError naming the file", func() {
		bad := filepath.Join(GinkgoT().TempDir(), "bad.json")
		Expect(os.WriteFile(bad, []byte(`{"driver": "local", "state_dir": "relative"}`), 0o600)).To(Succeed())
		r := runWith(bad, request("has_vm", 2, fx.UnknownVM))
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Type).To(Equal("Bosh::Clouds::CpiError"))
		Expect(r.Error.Message).To(ContainSubstring(bad))
		Expect(r.Error.Message).To(ContainSubstring("state_dir"))
	})
})
