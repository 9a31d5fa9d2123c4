package ctrvm

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

	"github.com/runway-cpi/runway/src/driver/local/container"
	"github.com/runway-cpi/runway/src/driver/local/mountsvc"
	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// ctr names everything of one container VM.
type ctr struct {
	v   *VMs
	cid string
	dir string
}

func (v *VMs) ctr(cid string) ctr { return ctr{v: v, cid: cid, dir: v.st.Dir(store.VMs, cid)} }

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
func (c ctr) run() string    { return filepath.Join(runRoot, c.v.stateKey(), c.cid) }
func (c ctr) rootfs() string { return filepath.Join(c.run(), "rootfs") }
func (c ctr) devs() string   { return filepath.Join(c.run(), "devs") }

// stateKey tells apart the containers of different state dirs on one host
// (two drivers may use the same VM name).
func (v *VMs) stateKey() string {
	h := sha256.Sum256([]byte(v.st.Root))
	return hex.EncodeToString(h[:4])
}

// id is the runtime's container id; cgroup is its cgroups path.
func (c ctr) id() string     { return "runway-" + c.v.stateKey() + "-" + c.cid }
func (c ctr) cgroup() string { return "/runway/" + c.v.stateKey() + "-" + c.cid }

// hostIf is the host end of the VM's veth (IFNAMSIZ allows 15 bytes):
// drawn when the VM is made, so no other VM instance ever has that name
// (the ports' guard counts on it); a VM recorded without one has the name
// its state dir and CID give.
func (c ctr) hostIf(rec *store.VM) string {
	if rec.Port != "" {
		return rec.Port
	}
	h := sha256.Sum256([]byte(c.v.st.Root + "\x00" + c.cid))
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
func (v *VMs) runtime() container.Runtime {
	return container.Runtime{Path: v.cfg.Runtime, Root: filepath.Join(v.st.Root, "runtime")}
}

// launch is how the supervisor starts a VM: its names, memory limit (for
// the OOM message) and network.
func (c ctr) launch(rec store.VM, props store.VMProps) container.Start {
	ram, _ := c.v.limits(props)
	st := container.Start{CID: rec.CID, Dir: c.dir, ID: c.id(), Cgroup: c.cgroup(), Runtime: c.v.runtime(),
		RAM: ram, ConsoleMax: c.v.consoleMax, Net: c.v.Bridge.Plan(rec.CID, c.hostIf(&rec), rec.Networks)}
	if rec.DiskMounts == store.DiskMountsService {
		st.MountSocket, st.Locks = filepath.Join(c.devs(), mountsvc.SocketName), c.v.st.Locks.Dir
		if rec.IDs != nil {
			st.MountUID = rec.IDs.Base
		}
	}
	return st
}

// prepareContainer makes a published VM's writable layer and its OCI
// config; its supervisor mounts its file systems and writes the settings
// inside, in its own mount namespace (prepareInNS).
func (v *VMs) prepareContainer(ctx context.Context, rec store.VM, props store.VMProps, argv []string) error {
	c := v.ctr(rec.CID)
	if err := os.MkdirAll(c.bundle(), 0o700); err != nil {
		return err
	}
	if err := v.makeLayer(ctx, c, v.ephemeralMiB(props)); err != nil {
		return err
	}
	if len(argv) == 0 {
		// A VM recorded before create_vm started the stemcell's init (or
		// refused a VM with nothing to run) idles.
		argv = []string{"/bin/sh", "-c", "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"}
	}
	ram, cpu := v.limits(props)
	spec, err := container.Spec(container.VM{CID: rec.CID, AgentID: rec.AgentID, Rootfs: c.rootfs(), Devs: c.devs(),
		Cgroup: c.cgroup(), Argv: argv, Env: props.Env, Agent: rec.Agent, RAMMiB: ram, CPU: cpu,
		Pids: v.cfg.PidsLimit, IDs: *rec.IDs, OwnMounts: v.ownMounts(rec)})
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
func (v *VMs) limits(p store.VMProps) (ramMiB, cpu int) {
	ramMiB, cpu = p.RAM, p.CPU
	if ramMiB <= 0 {
		ramMiB = v.cfg.DefaultRAMMiB
	}
	if cpu <= 0 {
		cpu = v.cfg.DefaultCPU
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
func (v *VMs) mountVM(rec store.VM) error {
	c := v.ctr(rec.CID)
	if rec.IDs == nil {
		return errNoUserNS(rec.CID)
	}
	if storage.IsMountPoint(c.rootfs()) {
		return nil
	}
	image := v.st.ImageDir(rec.StemcellCID)
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
	if err := v.mountLayer(c, run, *rec.IDs, image); err != nil {
		return err
	}
	own := v.ownMounts(rec)
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
			if dr, err := v.st.LoadDisk(l.Name()); err == nil && dr.AttachedTo == rec.CID {
				if _, err := v.attachInside(rec, l.Name()); err != nil {
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
