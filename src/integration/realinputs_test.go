package integration_test

import (
	"encoding/json"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/runway-cpi/runway/src/testkit/realinputs"
)

// What real BOSH sends (src/testkit/realinputs, each shape from its
// caller's source), on whichever driver the suite runs: the stemcell
// builder's stemcell.MF cloud_properties for the driver's infrastructure,
// the Director's network settings (prefix "32" on every network) and its
// create_vm env. The fixture's own keys (an image's disk size, a subnet)
// go over them, as an operator's would.
var _ = Describe("real callers' inputs", func() {
	It("accepts a real stemcell's cloud_properties, the Director's network settings and env", func() {
		infra := map[string]string{"local": "warden", "openstack": "openstack", "aws": "aws"}[fx.Driver]
		format := map[string]string{"warden": "files", "openstack": "qcow2", "aws": "raw"}[infra]
		props := realinputs.HeavyStemcell(infra, format)
		for k, v := range fx.ImageProps {
			props[k] = v
		}
		stemcell := asString(callV(3, "create_stemcell", fx.Image, props, map[string]any{"tags": map[string]string{"suite": "real-inputs"}}))
		DeferCleanup(func() { cleanUp("delete_stemcell", stemcell) })

		nets := map[string]any{}
		for name, n := range networks() {
			m := map[string]any{}
			for k, v := range n.(map[string]any) {
				m[k] = v
			}
			m["prefix"] = "32"
			m["dns"] = []string{"8.8.8.8"}
			if m["type"] == "manual" {
				m["nic_group"] = "1"
			}
			nets[name] = m
		}
		var res []json.RawMessage
		Expect(json.Unmarshal(call("create_vm", "agent-real", stemcell, fx.VMProps, nets, []string{}, realinputs.DirectorEnv("agent-real")), &res)).To(Succeed())
		vm := asString(res[0])
		DeferCleanup(func() { cleanUp("delete_vm", vm) })
		var got map[string]struct {
			Prefix string `json:"prefix"`
		}
		Expect(json.Unmarshal(res[1], &got)).To(Succeed())
		for name := range nets {
			Expect(got[name].Prefix).To(Equal("32"), "network %s", name)
		}
		call("delete_vm", vm)
	})
})
