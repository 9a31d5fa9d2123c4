package local

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func (d *Driver) containers() bool { return d.cfg.Isolation == IsolationContainer }

// ctr names everything of one container VM.
type ctr struct {
	d   *Driver
	cid string
	dir string
}

func (d *Driver) ctr(cid string) ctr { return ctr{d: d, cid: cid, dir: d.path(vms, cid)} }

func (c ctr) bundle() string { return filepath.Join(c.dir, "bundle") }
func (c ctr) rootfs() string { return filepath.Join(c.dir, "rootfs") }
func (c ctr) devs() string   { return filepath.Join(c.dir, "devs") }

// stateKey tells apart the containers of different state dirs on one host
// (two drivers may use the same VM name).
func (d *Driver) stateKey() string {
	h := sha256.Sum256([]byte(d.root))
	return hex.EncodeToString(h[:4])
}

// id is the runtime's container id; cgroup is its cgroups path; hostIf
// the host end of its veth (IFNAMSIZ allows 15 bytes).
func (c ctr) id() string     { return "runway-" + c.d.stateKey() + "-" + c.cid }
func (c ctr) cgroup() string { return "/runway/" + c.d.stateKey() + "-" + c.cid }
func (c ctr) hostIf() string {
	h := sha256.Sum256([]byte(c.d.root + "\x00" + c.cid))
	return "rw" + hex.EncodeToString(h[:6])
}

// runtimeRoot is the runtime's own state, kept under the state dir.
func (d *Driver) runtimeRoot() string { return filepath.Join(d.root, "runtime") }

// runtime runs the OCI runtime with args and returns its combined output.
func (d *Driver) runtime(ctx context.Context, args ...string) ([]byte, error) {
	rt := d.cfg.Container.Runtime
	if rt == "" { // process mode now, deleting a VM made in container mode
		for _, name := range []string{"runc", "crun"} {
			if p, err := exec.LookPath(name); err == nil {
				rt = p
				break
			}
		}
		if rt == "" {
			return nil, errors.New("no OCI runtime (runc, crun) on PATH")
		}
	}
	cmd := exec.CommandContext(ctx, rt, append([]string{"--root", d.runtimeRoot()}, args...)...)
	cmd.Env = []string{"PATH=" + vmPath}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return out, fmt.Errorf("%s %s: %w: %s", filepath.Base(rt), args[0], err, bytes.TrimSpace(out))
	}
	return out, nil
}

// runContainer makes and starts a published container VM.
func (d *Driver) runContainer(ctx context.Context, rec vmRecord, props vmProps, settings []byte, userData string) error {
	if err := d.prepareContainer(rec, props, rec.Command, settings, userData); err != nil {
		return err
	}
	if err := d.ensureBridge(ctx); err != nil {
		return err
	}
	ram, _ := d.limits(props)
	return d.startContainer(ctx, rec, d.netPlan(d.ctr(rec.CID), rec.Networks), ram)
}

// prepareContainer makes a published VM's bundle: the root file system
// (an overlay on the stemcell's unpacked image), the disks mount point,
// the settings files inside and the OCI config. Everything it mounts lies
// under the VM's directory, where teardown finds it.
func (d *Driver) prepareContainer(rec vmRecord, props vmProps, argv []string, settings []byte, userData string) error {
	c := d.ctr(rec.CID)
	for _, dir := range []string{c.bundle(), c.rootfs(), c.devs(), filepath.Join(c.dir, "upper"), filepath.Join(c.dir, "work")} {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
	}
	if err := d.mountVM(rec); err != nil {
		return err
	}
	if err := d.writeInside(rec, settings, userData); err != nil {
		return err
	}
	if len(argv) == 0 {
		// A VM recorded before create_vm started the stemcell's init (or
		// refused a VM with nothing to run) idles.
		argv = []string{"/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"}
	}
	spec, err := d.ociSpec(c, rec, props, argv)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.bundle(), "config.json"), b, 0o600)
}

// mountVM mounts the VM's root (an overlay on the stemcell's image) and
// its disks directory, unless mounted: after the host restarted, a VM
// starts again from its directory, with the disks attached to it.
func (d *Driver) mountVM(rec vmRecord) error {
	c := d.ctr(rec.CID)
	if mps, _ := mountsUnder(c.rootfs()); len(mps) > 0 {
		return nil
	}
	image := filepath.Join(d.path(stemcells, rec.StemcellCID), "image")
	for _, p := range []string{image, c.dir} {
		if strings.ContainsAny(p, ",:") {
			return fmt.Errorf("path %s holds ',' or ':', which an overlay mount cannot take", p)
		}
	}
	// The overlay's root takes the upper directory's owner and mode: the
	// image root's, or every user but root is kept out of the VM's /.
	upper := filepath.Join(c.dir, "upper")
	if fi, err := os.Stat(image); err != nil {
		return err
	} else if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		if err := os.Chown(upper, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
		if err := os.Chmod(upper, fi.Mode()&(os.ModePerm|os.ModeSticky)); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", image, upper, filepath.Join(c.dir, "work"))
	if err := unix.Mount("overlay", c.rootfs(), "overlay", 0, opts); err != nil {
		return fmt.Errorf("mounting the vm's root file system: %w", err)
	}
	// Disks are mounted below devs on the host; being a shared mount, each
	// one propagates into the running container's slave copy.
	if mps, _ := mountsUnder(c.devs()); len(mps) == 0 {
		if err := unix.Mount(c.devs(), c.devs(), "", unix.MS_BIND, ""); err != nil {
			return fmt.Errorf("binding the disks directory: %w", err)
		}
		if err := unix.Mount("", c.devs(), "", unix.MS_SHARED, ""); err != nil {
			return fmt.Errorf("sharing the disks directory: %w", err)
		}
		links, _ := os.ReadDir(filepath.Join(c.dir, "disks"))
		for _, l := range links {
			if checkCID("disk", l.Name()) != nil {
				continue
			}
			if dr, err := d.loadDisk(l.Name()); err == nil && dr.AttachedTo == rec.CID {
				if _, err := d.attachInside(rec.CID, l.Name()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// stopContainer ends a container VM for certain: SIGTERM reaches the VM's
// PID 1 through its supervisor, SIGKILL follows after the grace; then the
// runtime's forced delete, and whatever is left in the VM's cgroups (a
// runtime killed part-way through a create) is killed and removed.
func (d *Driver) stopContainer(ctx context.Context, cid string) error {
	c := d.ctr(cid)
	err := stopVM(ctx, cid, readPGID(c.dir), d.grace())
	_, _ = d.runtime(ctx, "delete", "--force", c.id())
	if cerr := c.killCgroups(ctx); cerr != nil {
		return cerr
	}
	if err != nil {
		return err
	}
	// A supervisor found by marker only (create killed part-way) may have
	// started a runtime meanwhile: look once more.
	return stopVM(ctx, cid, 0, d.grace())
}

// cgroupDirs lists the VM's cgroup directories on this host, under every
// v1 controller hierarchy and the v2 one.
func (c ctr) cgroupDirs() []string {
	var out []string
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	hier = append(hier, "/sys/fs/cgroup")
	for _, h := range hier {
		p := filepath.Join(h, c.cgroup())
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			out = append(out, p)
		}
	}
	return out
}

// killCgroups kills every process left in the VM's cgroups and removes
// them.
func (c ctr) killCgroups(ctx context.Context) error {
	dirs := c.cgroupDirs()
	if len(dirs) == 0 {
		return nil
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		alive := false
		for _, dir := range dirs {
			b, _ := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && pid > 1 {
					alive = true
					_ = syscall.Kill(pid, syscall.SIGKILL)
				}
			}
		}
		if !alive {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("processes of vm %s still in its cgroups after SIGKILL", c.cid)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, dir := range dirs {
		if err := os.Remove(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing cgroup %s: %w", dir, err)
		}
	}
	return nil
}

// teardownContainer undoes what prepareContainer and the network set up,
// after the VM is stopped: the host end of the veth, then every mount under
// the VM's directory, innermost first. It fails rather than leave a mount
// (removing the directory with a disk still mounted would delete the
// disk's data).
func (d *Driver) teardownContainer(cid string) error {
	c := d.ctr(cid)
	if err := deleteLink(c.hostIf()); err != nil {
		return err
	}
	if err := unmountAll(c.dir); err != nil {
		return err
	}
	// Belt and braces before the directory is removed: a mount the
	// mount table did not show under this path (a symlinked state dir)
	// would have another device.
	var top syscall.Stat_t
	if err := syscall.Stat(c.dir, &top); err != nil {
		return err
	}
	check := []string{c.rootfs(), c.devs()}
	if ents, err := os.ReadDir(c.devs()); err == nil {
		for _, e := range ents {
			check = append(check, filepath.Join(c.devs(), e.Name()))
		}
	}
	for _, p := range check {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err == nil && st.Dev != top.Dev {
			return fmt.Errorf("%s is still a mount point: not removing vm %s", p, c.cid)
		}
	}
	return nil
}

// mountsUnder lists the mount points at or below dir, innermost first.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	// Deepest first; a path mounted twice is listed twice.
	sort.SliceStable(out, func(i, j int) bool { return strings.Count(out[i], "/") > strings.Count(out[j], "/") })
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountAll unmounts everything at or below dir and checks none is left.
func unmountAll(dir string) error {
	for range 3 {
		mps, err := mountsUnder(dir)
		if err != nil {
			return err
		}
		if len(mps) == 0 {
			return nil
		}
		for _, mp := range mps {
			if err := unix.Unmount(mp, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("unmounting %s: %w", mp, err)
			}
		}
	}
	if mps, _ := mountsUnder(dir); len(mps) > 0 {
		return fmt.Errorf("still mounted after unmounting: %s", strings.Join(mps, ", "))
	}
	return nil
}
