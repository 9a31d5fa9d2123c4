// Package agentprobe is a VM command that does what a BOSH agent and its
// jobs do at boot on a warden-style stemcell (scripts/rootfs-dev bosh),
// printing each step's outcome: what the agent profile of the local and
// kubernetes drivers is tested with.
package agentprobe

// Script does as root what bosh-agent's bootstrap and a job do in a
// VM (platform/linux_platform.go: usermod, hostname, tmpfs and bind mounts
// with remounts, chown to vcap; the persistent disk bind-mounted at
// /var/vcap/store; its nftables firewall; jobs as vcap under monit), each
// step printing OK or FAIL, then hands PID 1 to the stemcell's runsvdir
// with a service of its own.
const Script = `
step() { name=$1; shift; if "$@" >/dev/null 2>&1; then echo "$name-OK"; else echo "$name-FAIL"; fi; }
step USERMOD usermod -p '$6$salt$hash' vcap
step USERADD useradd -m -s /bin/bash jobuser
step HOSTNAME hostname agent-probe
step CHOWN chown root:vcap /var/vcap/jobs
step TMPFS sh -c 'mkdir -p /var/vcap/data/sys/run && mount -t tmpfs -o size=1m tmpfs /var/vcap/data/sys/run'
step BIND sh -c 'mkdir -p /var/vcap/data/root_tmp && mount --bind /var/vcap/data/root_tmp /tmp && mount -o remount,bind,nodev,nosuid /tmp'
step SHM mount -o remount,noexec,nodev,nosuid /dev/shm
step FIREWALL iptables -A OUTPUT -p tcp -d 127.0.0.1 --dport 2822 -j ACCEPT
step SETUID chpst -u vcap:vcap true
step REMOUNT sh -c 'mkdir -p /var/vcap/data/root_log && mount /var/vcap/data/root_log /var/log -o bind && mount /var/log -o remount -o nodev -o nosuid -o noexec && mount /home /home -o bind && mount /home -o remount -o nodev -o nosuid'
mkdir -p /etc/sv/probe
cat > /etc/sv/probe/run <<'RUN'
#!/bin/sh
echo RUNSV-OK
until d=$(ls /warden-cpi-dev) && [ -n "$d" ] && mountpoint -q /warden-cpi-dev/$d; do sleep 0.1; done
if mount --bind /warden-cpi-dev/$d /var/vcap/store && echo kept > /var/vcap/store/from-agent; then echo STORE-OK; else echo STORE-FAIL; fi
cat > /var/vcap/monit/job/probe.monitrc <<'RC'
check process probe with pidfile /var/vcap/sys/run/probe.pid
  start program "/bin/sh -c 'echo $$ > /var/vcap/sys/run/probe.pid; exec chpst -u vcap:vcap sleep 600'"
  stop program "/bin/sh -c 'kill $(cat /var/vcap/sys/run/probe.pid)'"
RC
mkdir -p /var/vcap/sys/run
sed -i 's/^set daemon .*/set daemon 1/' /var/vcap/bosh/etc/monitrc
sv start monit
until [ "$(ps -o user= -p $(cat /var/vcap/sys/run/probe.pid 2>/dev/null) 2>/dev/null)" = vcap ]; do sleep 0.2; done
echo MONIT-OK
exec sleep 2147483647
RUN
chmod +x /etc/sv/probe/run
ln -s /etc/sv/probe /etc/service/probe
echo probe-init
exec /usr/sbin/runsvdir-start
`

// Steps are the lines Script prints, each with -OK or -FAIL.
var Steps = []string{"USERMOD", "USERADD", "HOSTNAME", "CHOWN", "TMPFS", "BIND", "SHM", "FIREWALL", "SETUID"}

// RemountSteps are Script's lines for the agent's remounts as it runs
// them, without MS_BIND (platform/linux_platform.go: SetupLogDir,
// SetupHomeDir): they succeed only where the binds' sources are the VM's
// own file systems (the local driver; not yet the kubernetes driver's
// pods, whose root is the host's overlay).
var RemountSteps = []string{"REMOUNT"}
