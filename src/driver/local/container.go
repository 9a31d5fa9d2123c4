package local

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/container"
	"github.com/runway-cpi/runway/src/driver/local/hostnet"
	"github.com/runway-cpi/runway/src/driver/local/mountsvc"
	"github.com/runway-cpi/runway/src/driver/local/procs"
	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

func (d *Driver) containers() bool { return d.cfg.Isolation == IsolationContainer }

// containerVMs: a VM is an OCI container made from a rootfs stemcell, with
// its own namespaces, limits and address on the bridge, watched by a
// supervisor (src/driver/local/container).
type containerVMs struct{ d *Driver }

// ctr names everything of one container VM.
type ctr struct {
	d   *Driver
	cid string
	dir string
}

func (d *Driver) ctr(cid string) ctr { return ctr{d: d, cid: cid, dir: d.st.Dir(store.VMs, cid)} }

// disksSource is the source name of the VM's disks directory's file
// system, as its mount table shows it.
const disksSource = "runway-disks"

// runRoot holds each container VM's mount points, outside the state dir:
// the VM's root user (an unprivileged host uid) must be able to reach its
// root file system and disks directory, and a state dir's parents may
// let no one but the host's root through.
const runRoot = "/run/runway"

func (c ctr) bundle() string { return filepath.Join(c.dir, "bundle") }

// run is the VM's directory of mount points: rootfs (the overlay), devs
// (its disks), image (the stemcell image as the VM's ids see it).
func (c ctr) run() string    { return filepath.Join(runRoot, c.d.stateKey(), c.cid) }
func (c ctr) rootfs() string { return filepath.Join(c.run(), "rootfs") }
func (c ctr) devs() string   { return filepath.Join(c.run(), "devs") }

// stateKey tells apart the containers of different state dirs on one host
// (two drivers may use the same VM name).
func (d *Driver) stateKey() string {
	h := sha256.Sum256([]byte(d.st.Root))
	return hex.EncodeToString(h[:4])
}

// id is the runtime's container id; cgroup is its cgroups path.
func (c ctr) id() string     { return "runway-" + c.d.stateKey() + "-" + c.cid }
func (c ctr) cgroup() string { return "/runway/" + c.d.stateKey() + "-" + c.cid }

// hostIf is the host end of the VM's veth (IFNAMSIZ allows 15 bytes):
// drawn when the VM is made, so no other VM instance ever has that name
// (the ports' guard counts on it); a VM recorded without one has the name
// its state dir and CID give.
func (c ctr) hostIf(rec *store.VM) string {
	if rec.Port != "" {
		return rec.Port
	}
	h := sha256.Sum256([]byte(c.d.st.Root + "\x00" + c.cid))
	return "rw" + hex.EncodeToString(h[:6])
}

// newPort draws a VM's host-side interface name.
func newPort() (string, error) {
	b := make([]byte, 6)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return "rw" + hex.EncodeToString(b), nil
}

// runtime is the OCI runtime with its state kept under the state dir.
func (d *Driver) runtime() container.Runtime {
	return container.Runtime{Path: d.cfg.Container.Runtime, Root: filepath.Join(d.st.Root, "runtime")}
}

// launch is how the supervisor starts a VM: its names, memory limit (for
// the OOM message) and network.
func (c ctr) launch(rec store.VM, props store.VMProps) container.Start {
	ram, _ := c.d.limits(props)
	st := container.Start{CID: rec.CID, Dir: c.dir, ID: c.id(), Cgroup: c.cgroup(), Runtime: c.d.runtime(),
		RAM: ram, ConsoleMax: c.d.consoleMax(), Net: c.d.bridge.Plan(rec.CID, c.hostIf(&rec), rec.Networks)}
	if rec.DiskMounts == store.DiskMountsService {
		st.MountSocket, st.Locks = filepath.Join(c.devs(), mountsvc.SocketName), c.d.st.Locks.Dir
		if rec.IDs != nil {
			st.MountUID = rec.IDs.Base
		}
	}
	return st
}

func (v containerVMs) Check(cid string, props store.VMProps) error {
	if len(cid) >= maxHostname {
		return driver.Invalid("vm cid %q is too long for a container's hostname (at most %d bytes)", cid, maxHostname-1)
	}
	cc := v.d.cfg.Container
	if props.RAM > cc.MaxRAMMiB {
		return driver.Invalid("cloud_properties.ram: %d MiB is more than a vm may have here (local.container.max_ram_mib: %d)", props.RAM, cc.MaxRAMMiB)
	}
	if props.CPU > cc.MaxCPU {
		return driver.Invalid("cloud_properties.cpu: %d is more than a vm may have here (local.container.max_cpu: %d)", props.CPU, cc.MaxCPU)
	}
	if props.RAM < 0 || props.CPU < 0 {
		return driver.Invalid("cloud_properties.ram and cpu: must not be negative")
	}
	if props.EphemeralDiskSize != 0 && props.EphemeralDiskSize < MinEphemeralDiskMiB {
		return driver.Invalid("cloud_properties.ephemeral_disk_size: %d MiB is too small for the vm's file system (at least %d)", props.EphemeralDiskSize, MinEphemeralDiskMiB)
	}
	return nil
}

func (v containerVMs) Executable(stemcell, name string) error {
	return findExecutableIn(v.d.st.ImageDir(stemcell), name)
}

func (containerVMs) UserDataScript() string { return container.UserDataPath }

// NoCommand: the stemcell's own init, as the warden CPI starts it.
func (v containerVMs) NoCommand(stemcell string) ([]string, error) {
	if err := findExecutableIn(v.d.st.ImageDir(stemcell), driver.AgentInit); err != nil {
		return nil, &driver.CreationError{Err: fmt.Errorf("the vm has no command (cloud_properties.command or user_data) and stemcell %s has no %s to start its agent: %w", stemcell, driver.AgentInit, err)}
	}
	return driver.AgentBoot, nil
}

// Start makes and starts a published container VM.
func (v containerVMs) Start(ctx context.Context, rec store.VM, props store.VMProps, settings []byte, userData string) error {
	if err := v.d.prepareContainer(ctx, rec, props, rec.Command); err != nil {
		return err
	}
	if err := v.d.bridge.Ensure(ctx); err != nil {
		return err
	}
	if err := v.d.ctr(rec.CID).launch(rec, props).Run(ctx); err != nil {
		return err
	}
	v.d.st.Log.Info("vm started in a container", "vm", rec.CID)
	return nil
}

// CanStart: a container VM starts only where container VMs are on.
func (v containerVMs) CanStart(rec *store.VM) error {
	if !v.d.containers() {
		return fmt.Errorf("vm %s was made in container mode: starting it needs local.isolation \"container\" (deleting it does not)", rec.CID)
	}
	return nil
}

func (v containerVMs) Restart(ctx context.Context, rec *store.VM, props store.VMProps) error {
	if rec.IDs == nil {
		return errNoUserNS(rec.CID)
	}
	if err := v.d.claimIDs(ctx, rec); err != nil {
		return err
	}
	if err := v.d.bridge.Ensure(ctx); err != nil {
		return err
	}
	if err := v.d.ctr(rec.CID).launch(*rec, props).Run(ctx); err != nil {
		return err
	}
	v.d.st.Log.Info("vm restarted", "vm", rec.CID)
	return nil
}

// prepareContainer makes a published VM's writable layer and its OCI
// config; its supervisor mounts its file systems and writes the settings
// inside, in its own mount namespace (prepareInNS).
func (d *Driver) prepareContainer(ctx context.Context, rec store.VM, props store.VMProps, argv []string) error {
	c := d.ctr(rec.CID)
	if err := os.MkdirAll(c.bundle(), 0o700); err != nil {
		return err
	}
	if err := d.makeLayer(ctx, c, d.ephemeralMiB(props)); err != nil {
		return err
	}
	if len(argv) == 0 {
		// A VM recorded before create_vm started the stemcell's init (or
		// refused a VM with nothing to run) idles.
		argv = []string{"/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"}
	}
	ram, cpu := d.limits(props)
	spec, err := container.Spec(container.VM{CID: rec.CID, AgentID: rec.AgentID, Rootfs: c.rootfs(), Devs: c.devs(),
		Cgroup: c.cgroup(), Argv: argv, Env: props.Env, Agent: rec.Agent, RAMMiB: ram, CPU: cpu,
		Pids: d.cfg.Container.PidsLimit, IDs: *rec.IDs, OwnMounts: d.ownMounts(rec)})
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(spec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.bundle(), "config.json"), b, 0o600)
}

// limits are the VM's memory (MiB) and CPUs: its cloud properties', else
// the configured defaults.
func (d *Driver) limits(p store.VMProps) (ramMiB, cpu int) {
	ramMiB, cpu = p.RAM, p.CPU
	if ramMiB <= 0 {
		ramMiB = d.cfg.Container.DefaultRAMMiB
	}
	if cpu <= 0 {
		cpu = d.cfg.Container.DefaultCPU
	}
	return ramMiB, cpu
}

// errNoUserNS: a VM made before container VMs had user namespaces.
func errNoUserNS(cid string) error {
	return fmt.Errorf("vm %s was made by an earlier Runway, without a user namespace: delete it and make it again (bosh recreate) to start it", cid)
}

// mountVM mounts the VM's root (an overlay on the stemcell's image, seen
// through the VM's id range) and its disks directory, unless mounted:
// after the host restarted, a VM starts again from its directory, with
// the disks attached to it.
func (d *Driver) mountVM(rec store.VM) error {
	c := d.ctr(rec.CID)
	if rec.IDs == nil {
		return errNoUserNS(rec.CID)
	}
	if storage.IsMountPoint(c.rootfs()) {
		return nil
	}
	image := d.st.ImageDir(rec.StemcellCID)
	for _, p := range []string{image, c.dir, c.run()} {
		if strings.ContainsAny(p, ",:") {
			return fmt.Errorf("path %s holds ',' or ':', which an overlay mount cannot take", p)
		}
	}
	run, err := c.mountPoints(*rec.IDs)
	if err != nil {
		return err
	}
	defer run.Close()
	// The image, owned by the VM's ids; read-only, no devices.
	if err := storage.BindIDMapped(image, run, "image", *rec.IDs, unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NODEV); err != nil {
		return fmt.Errorf("mounting the stemcell image for the vm: %w", err)
	}
	if err := d.mountLayer(c, run, *rec.IDs, image); err != nil {
		return err
	}
	own := d.ownMounts(rec)
	if err := makeOwnDirs(own, run, *rec.IDs, image); err != nil {
		return err
	}
	layer := filepath.Join(c.run(), "layer")
	// Made from inside the VM's run directory (chrooted): the overlay's
	// options, which the VM reads in its mount table, name its layers
	// /image and /layer, not the host's paths.
	err = storage.OnOwnThread(func() error {
		if err := unix.Chroot(c.run()); err != nil {
			return err
		}
		return unix.Mount("overlay", "/rootfs", "overlay", unix.MS_NODEV, "lowerdir=/image,upperdir=/layer/upper,workdir=/layer/work")
	})
	if err != nil {
		return fmt.Errorf("mounting the vm's root file system: %w", err)
	}
	// The overlay holds private copies of its layers' mounts: the host's
	// mount table keeps two mounts a VM (what every runc create copies).
	// The runtime makes the VM's own file systems from them: kept then.
	if len(own) == 0 {
		if err := storage.Unmount(filepath.Join(c.run(), "image"), layer); err != nil {
			return err
		}
	}
	// Disks are mounted below devs on the host; being a shared mount, each
	// one propagates into the running container's slave copy. A file
	// system of its own (not a directory of the host's /run bound there),
	// so the VM's mount table shows neither a host path nor the host's
	// /run.
	if !storage.IsMountPoint(c.devs()) {
		if err := unix.Mount(disksSource, c.devs(), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=755,size=64k,nr_inodes=4096"); err != nil {
			return fmt.Errorf("mounting the disks directory: %w", err)
		}
		if err := unix.Mount("", c.devs(), "", unix.MS_SHARED, ""); err != nil {
			return fmt.Errorf("sharing the disks directory: %w", err)
		}
		links, _ := os.ReadDir(filepath.Join(c.dir, "disks"))
		for _, l := range links {
			if store.CheckCID("disk", l.Name()) != nil {
				continue
			}
			if dr, err := d.st.LoadDisk(l.Name()); err == nil && dr.AttachedTo == rec.CID {
				if _, err := d.attachInside(rec, l.Name()); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// mountPoints makes the VM's run directory and its mount points, and
// answers it opened as a root. The run directory belongs to the VM's root
// (it must pass through; no other host user can); devs belongs to the
// host's root and is 0755: the VM sees its disks there and can put
// nothing there.
func (c ctr) mountPoints(ids storage.IDRange) (*os.Root, error) {
	// The state dir's directory goes with its last VM: made again, and
	// again if that happens meanwhile.
	for try := 0; ; try++ {
		for _, dir := range []string{runRoot, filepath.Dir(c.run())} {
			if err := os.MkdirAll(dir, 0o711); err != nil {
				return nil, err
			}
			if err := os.Chmod(dir, 0o711); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return nil, err
			}
		}
		err := os.Mkdir(c.run(), 0o700)
		if err == nil || errors.Is(err, fs.ErrExist) {
			break
		}
		if !errors.Is(err, fs.ErrNotExist) || try == 5 {
			return nil, err
		}
	}
	if err := os.Lchown(c.run(), int(ids.Base), int(ids.Base)); err != nil {
		return nil, err
	}
	run, err := os.OpenRoot(c.run())
	if err != nil {
		return nil, err
	}
	for name, mode := range map[string]os.FileMode{"rootfs": 0o755, "devs": 0o755} {
		if err := storage.MkdirOwned(run, name, mode, 0, 0); err != nil {
			run.Close()
			return nil, err
		}
	}
	return run, nil
}

// Stop ends a container VM for certain: SIGTERM reaches the VM's PID 1
// through its supervisor, SIGKILL follows after the grace; then the
// runtime's forced delete, and whatever is left in the VM's cgroups (a
// runtime killed part-way through a create) is killed and removed.
func (v containerVMs) Stop(ctx context.Context, rec *store.VM) error {
	c := v.d.ctr(rec.CID)
	pgid := procs.ReadPGID(c.dir)
	handled, err := procs.StopLeader(ctx, rec.CID, pgid, v.d.grace())
	if !handled {
		err = procs.Stop(ctx, rec.CID, pgid, v.d.grace())
	}
	// The supervisor deletes its container as it ends; one it could not
	// (killed) is still in the runtime's state.
	if _, serr := os.Stat(filepath.Join(v.d.runtime().Root, c.id())); serr == nil {
		_, _ = v.d.runtime().Run(ctx, "delete", "--force", c.id())
	}
	if cerr := container.KillCgroups(ctx, rec.CID, c.cgroup()); cerr != nil {
		return cerr
	}
	if err != nil || pgid > 1 {
		return err
	}
	// A supervisor found by marker only (create killed part-way) may have
	// started a runtime meanwhile: look once more.
	return procs.Stop(ctx, rec.CID, 0, v.d.grace())
}

// Teardown undoes what prepareContainer and the network set up, after the
// VM is stopped: the host end of the veth, then every mount under the
// VM's directory, innermost first. It fails rather than leave a mount
// (removing the directory with a disk still mounted would delete the
// disk's data).
func (v containerVMs) Teardown(rec *store.VM) error {
	c := v.d.ctr(rec.CID)
	if err := hostnet.DeleteLink(c.hostIf(rec)); err != nil {
		return err
	}
	if err := v.retirePort(rec); err != nil {
		return fmt.Errorf("removing vm %s from the bridge ports' guard: %w", rec.CID, err)
	}
	// What the driver mounted, by name (the mount table grows with every
	// VM); then every mount below, by device, else by the mount table.
	var mps []string
	for _, devs := range []string{c.devs(), filepath.Join(c.dir, "devs")} {
		if ents, err := os.ReadDir(devs); err == nil {
			for _, e := range ents {
				mps = append(mps, filepath.Join(devs, e.Name()))
			}
		}
	}
	mps = append(mps, c.devs(), c.rootfs(), filepath.Join(c.run(), "image"), filepath.Join(c.run(), "layer"),
		filepath.Join(c.dir, "devs"), filepath.Join(c.dir, "rootfs")) // the last two: VMs made before /run/runway
	if err := storage.Unmount(mps...); err != nil {
		return err
	}
	for _, dir := range []string{c.run(), c.dir} {
		if storage.NoMountsIn(dir, 2) != nil {
			if err := storage.UnmountAll(dir); err != nil {
				return err
			}
		}
		// Belt and braces before the directory is removed: a mount the
		// mount table did not show under this path (a symlinked state
		// dir) would have another device.
		if err := storage.NoMountsIn(dir, 2); err != nil {
			return fmt.Errorf("not removing vm %s: %w", c.cid, err)
		}
	}
	if err := os.RemoveAll(c.run()); err != nil {
		return err
	}
	_ = os.Remove(filepath.Dir(c.run())) // the state dir's, once its last VM is gone
	return nil
}

// Attach records the disk in the VM's agent settings, as the warden CPI
// does, and mounts it into the VM if it runs (else it is mounted when
// it starts).
func (v containerVMs) Attach(ctx context.Context, rec *store.VM, disk string) (string, error) {
	inside := container.DisksDir + "/" + disk
	if err := v.d.updateDiskSettings(rec.CID, disk, inside); err != nil {
		return "", fmt.Errorf("recording disk %s in vm %s's agent settings: %w", disk, rec.CID, err)
	}
	if _, err := v.d.inVM(ctx, rec, "attach", disk); err != nil {
		return "", err
	}
	return inside, nil
}

// Detach takes the disk out of the VM if it runs (it disappears inside at
// once, from every mount namespace of the VM) and out of its agent
// settings.
func (v containerVMs) Detach(ctx context.Context, rec *store.VM, disk string) (bool, error) {
	if err := v.d.updateDiskSettings(rec.CID, disk, ""); err != nil {
		return false, fmt.Errorf("removing disk %s from vm %s's agent settings: %w", disk, rec.CID, err)
	}
	out, err := v.d.inVM(ctx, rec, "detach", disk)
	return strings.Contains(out, cutOff), err
}

// retirePort hands the VM's port to the ports' guard for removal (in a
// batch; at once when it was the state dir's last VM).
func (v containerVMs) retirePort(rec *store.VM) error {
	var addrs []string
	for _, n := range rec.Networks {
		if n.IP != "" {
			addrs = append(addrs, n.IP)
		}
	}
	last := true
	entries, _ := os.ReadDir(filepath.Join(v.d.st.Root, "vms"))
	for _, e := range entries {
		if e.Name() != rec.CID && !strings.HasPrefix(e.Name(), ".") {
			last = false
			break
		}
	}
	key := v.d.stateKey()
	r := hostnet.Retired{Path: filepath.Join(v.d.st.Root, "guard-retired.json"), Table: hostnet.GuardTable(key), Locks: v.d.st.Locks}
	return r.Retire(context.Background(), v.d.ctr(rec.CID).hostIf(rec), hostnet.VMMAC(key, rec.CID), addrs, last)
}
