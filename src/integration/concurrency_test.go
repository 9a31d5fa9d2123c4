package integration_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"sync"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

// 40 bin/cpi processes at once: each creates a VM and a disk, and attaches
// its disk to one of 4 shared VMs. Afterwards every resource any process
// reported exists, each shared VM lists exactly the disks attached to it,
// and no address was handed out twice.
var _ = Describe("concurrent bin/cpi processes", func() {
	It("keep the state consistent and account for every resource", func() {
		const workers, shared = 40, 4
		stemcell := asString(call("create_stemcell", fx.Image, fx.ImageProps))
		DeferCleanup(func() { cleanUp("delete_stemcell", stemcell) })

		// Every VM and disk made, so a failed spec still removes them (and
		// its failure is not repeated by the next spec's leftover check).
		var created, disks sync.Map
		DeferCleanup(func() {
			created.Range(func(vm, _ any) bool { cleanUp("delete_vm", vm); return true })
			disks.Range(func(disk, _ any) bool { cleanUp("delete_disk", disk); return true })
		})

		createVM := func(agent string) (string, string) {
			var res []json.RawMessage
			Expect(json.Unmarshal(call("create_vm", agent, stemcell, fx.VMProps, networks(), []string{}, map[string]any{}), &res)).To(Succeed())
			var nets map[string]struct {
				IP string `json:"ip"`
			}
			Expect(json.Unmarshal(res[1], &nets)).To(Succeed())
			ip := ""
			for _, n := range nets {
				ip = n.IP
			}
			cid := asString(res[0])
			created.Store(cid, true)
			return cid, ip
		}

		sharedVMs := make([]string, shared)
		for i := range sharedVMs {
			sharedVMs[i], _ = createVM(fmt.Sprintf("shared-%d", i))
		}

		type result struct{ vm, ip, disk, target string }
		results := make([]result, workers)
		var wg sync.WaitGroup
		for i := 0; i < workers; i++ {
			wg.Add(1)
			go func(i int) {
				defer GinkgoRecover()
				defer wg.Done()
				vm, ip := createVM(fmt.Sprintf("worker-%d", i))
				disk := asString(call("create_disk", 64, fx.DiskProps, nil))
				disks.Store(disk, true)
				target := sharedVMs[i%shared]
				call("attach_disk", target, disk)
				results[i] = result{vm, ip, disk, target}
			}(i)
		}
		wg.Wait()

		ips := map[string]bool{}
		want := map[string][]string{}
		for _, r := range results {
			Expect(asBool(call("has_vm", r.vm))).To(BeTrue())
			Expect(asBool(call("has_disk", r.disk))).To(BeTrue())
			if r.ip != "" {
				Expect(ips).NotTo(HaveKey(r.ip), "address handed out twice")
				ips[r.ip] = true
			}
			want[r.target] = append(want[r.target], r.disk)
		}
		for _, vm := range sharedVMs {
			var got []string
			Expect(json.Unmarshal(call("get_disks", vm), &got)).To(Succeed())
			sort.Strings(got)
			sort.Strings(want[vm])
			Expect(got).To(Equal(want[vm]), "disks of shared vm %s", vm)
		}

		if fx.Local {
			// Exactly the resources reported exist: no stray or half-made ones.
			entries, _ := os.ReadDir(filepath.Join(fx.StateDir, "vms"))
			Expect(entries).To(HaveLen(workers+shared), cleanUpFailures())
			entries, _ = os.ReadDir(filepath.Join(fx.StateDir, "disks"))
			Expect(entries).To(HaveLen(workers), cleanUpFailures())
		}

		// Tear down concurrently too: deleting shared VMs detaches their disks.
		for _, r := range results {
			wg.Add(1)
			go func(r result) {
				defer GinkgoRecover()
				defer wg.Done()
				call("delete_vm", r.vm)
			}(r)
		}
		for _, vm := range sharedVMs {
			wg.Add(1)
			go func(vm string) {
				defer GinkgoRecover()
				defer wg.Done()
				call("delete_vm", vm)
			}(vm)
		}
		wg.Wait()
		for _, r := range results {
			wg.Add(1)
			go func(disk string) {
				defer GinkgoRecover()
				defer wg.Done()
				call("delete_disk", disk)
			}(r.disk)
		}
		wg.Wait()
		if fx.Local {
			for _, kind := range []string{"vms", "disks"} {
				entries, _ := os.ReadDir(filepath.Join(fx.StateDir, kind))
				Expect(entries).To(BeEmpty(), "%s\n%s", kind, cleanUpFailures())
			}
			var table map[string]string
			b, err := os.ReadFile(filepath.Join(fx.StateDir, "ipam.json"))
			Expect(err).NotTo(HaveOccurred())
			Expect(json.Unmarshal(b, &table)).To(Succeed())
			Expect(table).To(BeEmpty(), "addresses not released")
		}
	})
})
