package integration_test

import (
	"os/exec"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/runway-cpi/runway/src/rpc"
)

// bin/cpi under `ip netns exec`, which mounts a /sys of its own without
// the cgroup hierarchies: runc would fail every VM with "no cgroup mount
// found in mountinfo". Container mode refuses the call instead, saying
// what happened and how to run it (nsenter keeps the host's mounts).
var _ = describeContainer("bin/cpi where the host's cgroups are hidden", func() {
	It("refuses every call, naming `ip netns exec` and how to enter a namespace instead", func() {
		Expect(runRaw(request("has_vm", 2, "vm-none")).Error).To(BeNil(), "the same call through nsenter --net")
		cmd := exec.Command("ip", "netns", "exec", fx.NetNS, cpiBin, "-configPath", fx.ConfigPath)
		cmd.Env = directorEnv()
		cmd.Stdin = strings.NewReader(request("has_vm", 2, "vm-none"))
		out, err := cmd.Output()
		Expect(err).NotTo(HaveOccurred())
		reply, err := rpc.ParseReply(out)
		Expect(err).NotTo(HaveOccurred())
		Expect(reply.Error).NotTo(BeNil())
		Expect(reply.Error.Message).To(And(ContainSubstring("no cgroup or cgroup2 line in /proc/self/mountinfo"),
			ContainSubstring(`"ip netns exec"`), ContainSubstring(`"nsenter --net=/run/netns/NAME --"`)))
	})
})
