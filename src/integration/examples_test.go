package integration_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/gexec"

	"github.com/runway-cpi/runway/src/testkit/cpibin"
)

// go test runs a package's tests in its directory (src/integration);
// runtime.Caller's path would not survive -trimpath (scripts/test).
func repoRoot() string { return filepath.Join("..", "..") }

func envWithGroups(deployment string) map[string]any {
	return map[string]any{"bosh": map[string]any{"group": "it-" + deployment + "-web",
		"groups": []string{"it", deployment, "web"}, "password": "not-for-hooks"}}
}

var _ = describeLocal("the hook examples in docs/examples/hooks", func() {
	It("the quota script denies the deployment's VM beyond max, counting what the driver lists", func() {
		h := newHookEnv(map[string]any{})
		dir := filepath.Join(h.hooksDir, "create_vm-pre.d")
		Expect(os.MkdirAll(dir, 0o755)).To(Succeed())
		src, err := os.ReadFile(filepath.Join(repoRoot(), "docs/examples/hooks/create_vm-pre.d/10-quota"))
		Expect(err).NotTo(HaveOccurred())
		Expect(os.WriteFile(filepath.Join(dir, "10-quota"), src, 0o755)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(dir, "quota.conf"), []byte(fmt.Sprintf("max=2\ncpi=\"%s -configPath %s\"\n", cpiBin, h.cfg)), 0o644)).To(Succeed())

		sc := h.stemcell()
		for i := 0; i < 2; i++ {
			r := h.createVM(sc, envWithGroups("dep-a"))
			Expect(r.Error).To(BeNil())
		}
		// The quota counts by metadata, which the Director sets after create_vm.
		for _, vm := range listVMs(h) {
			Expect(h.run("set_vm_metadata", vm, map[string]string{"deployment": "dep-a"}).Error).To(BeNil())
		}
		r := h.createVM(sc, envWithGroups("dep-a"))
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Type).To(Equal("Bosh::Clouds::CloudError"))
		Expect(r.Error.Message).To(ContainSubstring("quota: deployment dep-a already has 2 of 2 VMs"))
		Expect(h.createVM(sc, envWithGroups("dep-b")).Error).To(BeNil(), "another deployment has its own quota")
		Expect(h.vms()).To(Equal(3))
	})

	It("the quota extension defers create_vm beyond max and allows it again after a delete", func() {
		bin, err := gexec.Build("github.com/runway-cpi/runway/docs/examples/hooks/quota-extension")
		Expect(err).NotTo(HaveOccurred())
		l, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := l.Addr().String()
		l.Close()
		cmd := exec.Command(bin, "-listen", addr, "-max", "1", "-retry-after", "45")
		session, err := gexec.Start(cmd, GinkgoWriter, GinkgoWriter)
		Expect(err).NotTo(HaveOccurred())
		DeferCleanup(func() { session.Kill().Wait() })
		Eventually(func() error {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				c.Close()
			}
			return err
		}, 10*time.Second).Should(Succeed())

		h := newHookEnv(map[string]any{"extensions": []any{map[string]any{"name": "quota",
			"operations": []string{"create_vm", "delete_vm"}, "clientConfig": map[string]any{"url": "http://" + addr}}}})
		sc := h.stemcell()
		Expect(h.createVM(sc, envWithGroups("dep-a")).Error).To(BeNil())
		r := h.createVM(sc, envWithGroups("dep-a"))
		Expect(r.Error).NotTo(BeNil())
		Expect(r.Error.Type).To(Equal("Bosh::Clouds::VMCreationFailed"))
		Expect(r.Error.OkToRetry).To(BeTrue())
		Expect(r.Error.Message).To(ContainSubstring("retry after 45s"))
		Expect(h.vms()).To(Equal(1))
		for _, vm := range listVMs(h) {
			Expect(h.run("delete_vm", vm).Error).To(BeNil())
		}
		Expect(h.createVM(sc, envWithGroups("dep-a")).Error).To(BeNil())
	})
})

func listVMs(h *hookEnv) []string {
	r := h.run("list_vms", map[string]string{"director": "it-director"})
	Expect(r.Error).To(BeNil())
	cids, err := cpibin.ListedCIDs(r.Result)
	Expect(err).To(Succeed())
	return cids
}
