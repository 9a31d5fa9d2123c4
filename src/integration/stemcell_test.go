package integration_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/runway-cpi/runway/src/testkit/agentprobe"
	"github.com/runway-cpi/runway/src/testkit/netns"
)

// The dev stemcell (scripts/rootfs-dev bosh) in VMs made by bin/cpi that
// boot it as the agent profile does (no command: runit), driven the way
// bosh-agent and the Director drive a stemcell: monit through the agent's
// own HTTP requests and `monit` commands, sshd and sudo as `bosh ssh`
// uses them, the syslog the agent's audit log writes to.
var _ = describeContainer("the dev stemcell", Ordered, func() {
	var stemcell string
	BeforeAll(func() { stemcell = boshStemcell() })
	boot := func() (string, string) {
		vm, ip := createVM(stemcell, map[string]any{"bosh_agent": true}, dynamic)
		DeferCleanup(func() { cleanUp("delete_vm", vm) })
		return vm, ip
	}

	It("drives monit as the agent does: its HTTP requests, and `monit` as it runs it", func() {
		vm, _ := boot()
		pw := randomHex()
		m := agentprobe.Monit{Client: vmHTTPClient(vm), Host: "127.0.0.1:2822", User: "vcap", Password: pw}
		// monit is down until the agent starts it: its front answers 503,
		// which the agent retries.
		Eventually(func() error { _, err := m.Status(); return err }, "20s", "100ms").Should(MatchError(ContainSubstring("503")))
		// The agent writes monit's credentials and starts monit (sv start
		// monit); the Director's first routine stop finds no job:
		// `monit stop -g vcap` succeeds, as monit 5.2 does.
		vmExec(vm, fmt.Sprintf("umask 077; echo 'vcap:%s' > /var/vcap/monit/monit.user; sv start monit", pw))
		var st agentprobe.MonitStatus
		Eventually(func() (err error) { st, err = m.Status(); return err }, "20s", "100ms").Should(Succeed())
		Expect(st.InGroup("vcap")).To(BeEmpty())
		vmExec(vm, "monit stop -g vcap")
		// A job's monit file, then the agent's reload
		// (monit_job_supervisor.go): sv kill monit, sv start monit, again
		// until monit's incarnation changes. It is a start time in
		// seconds, so a monit started again within the same second keeps
		// it, and the agent kills it once more.
		vmExec(vm, `cat > /var/vcap/monit/job/0000_probe.monitrc <<'RC'
check process probe with pidfile /var/vcap/sys/run/probe/pid
  start program "/bin/sh -c 'mkdir -p /var/vcap/sys/run/probe; chpst -u vcap:vcap sleep 600 & echo $! > /var/vcap/sys/run/probe/pid'"
  stop program "/bin/sh -c 'kill $(cat /var/vcap/sys/run/probe/pid)'"
  group vcap
RC`)
		Eventually(func() string {
			vmExec(vm, "sv kill monit; sv start monit")
			var now agentprobe.MonitStatus
			Eventually(func() (err error) { now, err = m.Status(); return err }, "20s", "100ms").Should(Succeed())
			return now.Incarnation
		}, "60s", "1s").ShouldNot(Equal(st.Incarnation))
		Eventually(func() []string { st, _ := m.Status(); return st.InGroup("vcap") }, "20s", "200ms").Should(Equal([]string{"probe"}))
		running := func() bool {
			st, err := m.Status()
			s, _ := st.Service("probe")
			return err == nil && s.Running() && s.Pending == 0
		}
		Expect(m.Start("probe")).To(Succeed())
		Eventually(running, "20s", "200ms").Should(BeTrue())
		Expect(vmExec(vm, "ps -o user= -p $(cat /var/vcap/sys/run/probe/pid)")).To(Equal("vcap\n"))
		Expect(m.Stop("probe")).To(Succeed())
		Eventually(func() int { st, _ := m.Status(); s, _ := st.Service("probe"); return s.Monitor }, "20s", "200ms").Should(Equal(0))
		Expect(m.Start("probe")).To(Succeed())
		Eventually(running, "20s", "200ms").Should(BeTrue())
		Expect(m.Unmonitor("probe")).To(Succeed())
		Eventually(func() int { st, _ := m.Status(); s, _ := st.Service("probe"); return s.Monitor }, "20s", "200ms").Should(Equal(0))
		// The agent's drain, then its stop: the job stops (monit 5.33 alone
		// ignores a stop of a service it does not monitor, and the job then
		// holds /var/vcap/store), and stays unmonitored.
		pid := strings.TrimSpace(vmExec(vm, "cat /var/vcap/sys/run/probe/pid"))
		Expect(m.Stop("probe")).To(Succeed())
		Eventually(func() string { return vmExec(vm, "kill -0 "+pid+" 2>/dev/null && echo alive || echo gone") }, "20s", "200ms").Should(Equal("gone\n"), func() string { st, _ := m.Status(); return fmt.Sprintf("%+v\n%s", st, console(vm)()) })
		// monit unsets monitoring once it has seen the process stop, a
		// moment after it is gone: then it stays so.
		monitor := func() int { st, _ := m.Status(); s, _ := st.Service("probe"); return s.Monitor }
		Eventually(monitor, "20s", "200ms").Should(Equal(0))
		Consistently(monitor, "2s", "200ms").Should(Equal(0))
		Expect(m.Start("probe")).To(Succeed())
		Eventually(running, "20s", "200ms").Should(BeTrue())
		bad := m
		bad.Password = "not-" + pw
		_, err := bad.Status()
		Expect(err).To(MatchError(ContainSubstring("401")))
		// `monit` as the agent runs it at a routine stop (no -c: it finds
		// its control file), and monit summary when that fails.
		Expect(m.Start("probe")).To(Succeed())
		Eventually(running, "20s", "200ms").Should(BeTrue())
		vmExec(vm, "monit stop -g vcap")
		Eventually(func() int { st, _ := m.Status(); s, _ := st.Service("probe"); return s.Monitor }, "20s", "200ms").Should(Equal(0))
		Expect(vmExec(vm, "monit summary")).To(ContainSubstring("probe"))
	})

	It("makes each VM's ssh host keys at its first boot, and lets a `bosh ssh` user in with its key and sudo without a password", func() {
		vm1, ip1 := boot()
		vm2, _ := boot()
		hostKey := func(vm string) func() string {
			return func() string {
				b, _ := os.ReadFile(filepath.Join(vmRoot(vm), "etc/ssh/ssh_host_rsa_key.pub"))
				return string(b)
			}
		}
		Eventually(hostKey(vm1), "20s", "100ms").Should(HavePrefix("ssh-rsa "))
		Eventually(hostKey(vm2), "20s", "100ms").Should(HavePrefix("ssh-rsa "))
		Expect(hostKey(vm1)()).NotTo(Equal(hostKey(vm2)()), "two VMs of one stemcell share a host key")
		dir := GinkgoT().TempDir()
		key := filepath.Join(dir, "id")
		run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
		pub, err := os.ReadFile(key + ".pub")
		Expect(err).NotTo(HaveOccurred())
		// What the agent's ssh setup does (bosh-agent: agent/action/ssh.go,
		// platform/linux_platform.go CreateUser, AddUserToGroups, SetupSSH).
		vmExec(vm1, fmt.Sprintf(`mkdir -p /var/vcap/bosh_ssh && useradd -m -b /var/vcap/bosh_ssh -s /bin/bash bosh_probe
chmod 700 /var/vcap/bosh_ssh/bosh_probe
usermod -G vcap,admin,bosh_sudoers,bosh_sshers bosh_probe
mkdir -p /var/vcap/bosh_ssh/bosh_probe/.ssh && chown bosh_probe /var/vcap/bosh_ssh/bosh_probe/.ssh
printf '%%s' '%s' > /var/vcap/bosh_ssh/bosh_probe/.ssh/authorized_keys
chown bosh_probe /var/vcap/bosh_ssh/bosh_probe/.ssh/authorized_keys && chmod 600 /var/vcap/bosh_ssh/bosh_probe/.ssh/authorized_keys`,
			strings.TrimSpace(string(pub))))
		// The host key the agent hands the CLI (/etc/ssh/ssh_host_rsa_key.pub)
		// is the one sshd presents.
		kh := filepath.Join(dir, "known_hosts")
		Expect(os.WriteFile(kh, []byte(ip1+" "+hostKey(vm1)()), 0o600)).To(Succeed())
		ssh := func(user, command string) (string, error) {
			out, err := exec.Command("nsenter", "--net=/run/netns/"+fx.NetNS, "--", "ssh", "-i", key,
				"-o", "UserKnownHostsFile="+kh, "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
				"-o", "HostKeyAlgorithms=rsa-sha2-512,rsa-sha2-256", "-o", "ConnectTimeout=10",
				user+"@"+ip1, command).Output()
			if ee, ok := err.(*exec.ExitError); ok {
				err = fmt.Errorf("%w: %s", err, ee.Stderr)
			}
			return string(out), err
		}
		var out string
		Eventually(func() (err error) { out, err = ssh("bosh_probe", "sudo -n id -u"); return err }, "20s", "500ms").Should(Succeed())
		Expect(out).To(Equal("0\n"))
		// root may not log in, whatever its keys.
		vmExec(vm1, "mkdir -p /root/.ssh && cp /var/vcap/bosh_ssh/bosh_probe/.ssh/authorized_keys /root/.ssh/")
		_, err = ssh("root", "true")
		Expect(err).To(HaveOccurred())
	})

	It("has a syslog on /dev/log, where the agent's audit log writes", func() {
		vm, _ := boot()
		word := "probe-" + randomHex()
		// rsyslogd makes the socket as it starts (logger drops what it
		// cannot send and still exits 0; the agent retries its dial).
		Eventually(func() error { return exec.Command("nsenter", vmNS(vm, "test", "-S", "/dev/log")...).Run() },
			"20s", "100ms").Should(Succeed())
		vmExec(vm, "logger -t bosh-agent-audit "+word)
		Eventually(func() string { b, _ := os.ReadFile(filepath.Join(vmRoot(vm), "var/log/syslog")); return string(b) },
			"20s", "200ms").Should(ContainSubstring("bosh-agent-audit: " + word))
	})
})

func randomHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// vmPID is a container VM's init, as the host sees it.
func vmPID(vm string) string {
	b, err := os.ReadFile(filepath.Join(vmDir(vm), "container.pid"))
	ExpectWithOffset(2, err).NotTo(HaveOccurred())
	return strings.TrimSpace(string(b))
}

// vmNS is nsenter's arguments to run argv as root inside a VM (all its
// namespaces), with the agent's PATH.
func vmNS(vm string, argv ...string) []string {
	return append([]string{"-t", vmPID(vm), "-a", "--", "/usr/bin/env", "-",
		"PATH=/var/vcap/bosh/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, argv...)
}

// vmExec runs a shell script as root inside a VM, as the agent runs its
// commands, and answers its output; it must succeed.
func vmExec(vm, script string) string {
	out, err := exec.Command("nsenter", vmNS(vm, "/bin/sh", "-c", script)...).CombinedOutput()
	ExpectWithOffset(1, err).NotTo(HaveOccurred(), "in %s: %s\n%s", vm, script, out)
	return string(out)
}

// vmHTTPClient connects inside a VM's network namespace (its 127.0.0.1),
// otherwise Go's default client, as the agent's.
func vmHTTPClient(vm string) *http.Client {
	ns := "/proc/" + vmPID(vm) + "/ns/net"
	return &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (c net.Conn, err error) {
			if e := netns.DoPath(ns, func() {
				var d net.Dialer
				c, err = d.DialContext(ctx, network, addr)
			}); e != nil {
				return nil, e
			}
			return c, err
		}}, Timeout: 30 * time.Second}
}
