package ctrvm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/container"
	"github.com/runway-cpi/runway/src/driver/local/procs"
	"github.com/runway-cpi/runway/src/driver/local/record"
	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// vmFS is a VM's root file system as bin/cpi writes into it: every path
// resolved inside it (os.Root: a link the image or the running VM planted
// cannot make bin/cpi write on the host), and everything made owned by
// the VM's root (a file the host's root made would be nobody's inside).
type vmFS struct {
	root     *os.Root
	uid, gid int
}

func (v *VMs) openVMFS(rec store.VM) (*vmFS, error) {
	if rec.IDs == nil {
		return nil, errNoUserNS(rec.CID)
	}
	root, err := os.OpenRoot(v.ctr(rec.CID).rootfs())
	if err != nil {
		return nil, err
	}
	return &vmFS{root: root, uid: int(rec.IDs.Base), gid: int(rec.IDs.Base)}, nil
}

func (vfs *vmFS) Close() error { return vfs.root.Close() }

// mkdirAll makes dir (absolute, inside the VM) and its missing parents.
func (vfs *vmFS) mkdirAll(dir string) error {
	p := ""
	for _, part := range strings.Split(strings.Trim(dir, "/"), "/") {
		p = filepath.Join(p, part)
		if fi, err := vfs.root.Lstat(p); err == nil {
			if fi.IsDir() {
				continue
			}
			// The VM put something else there: the driver writes only
			// into real directories, and says so rather than fail on
			// the way.
			what := "a " + fi.Mode().Type().String() + " file"
			if fi.Mode()&fs.ModeSymlink != 0 {
				target, _ := vfs.root.Readlink(p)
				what = fmt.Sprintf("a link (to %q)", target)
			} else if fi.Mode().IsRegular() {
				what = "a file"
			}
			return fmt.Errorf("/%s in the vm is %s, not a directory: the vm replaced it, and the driver writes its settings only into real directories; recreate the vm", p, what)
		}
		if err := vfs.root.Mkdir(p, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("making %s in the vm: %w", dir, err)
		}
		if err := vfs.root.Lchown(p, vfs.uid, vfs.gid); err != nil {
			return err
		}
	}
	return nil
}

// write replaces file path (absolute, inside the VM) with b.
func (vfs *vmFS) write(path string, b []byte, mode os.FileMode) error {
	name := strings.TrimPrefix(path, "/")
	if err := vfs.root.WriteFile(name, b, mode); err != nil {
		return fmt.Errorf("writing %s in the vm: %w", path, err)
	}
	if err := vfs.root.Lchown(name, vfs.uid, vfs.gid); err != nil {
		return fmt.Errorf("writing %s in the vm: %w", path, err)
	}
	return nil
}

// writeInside puts the agent settings and user data where a warden
// stemcell's bosh-agent reads them.
func (v *VMs) writeInside(rec store.VM, settings []byte, userData string) error {
	vfs, err := v.openVMFS(rec)
	if err != nil {
		return err
	}
	defer vfs.Close()
	for _, dir := range []string{filepath.Dir(container.AgentSettingsPath), container.DisksDir, "/etc"} {
		if err := vfs.mkdirAll(dir); err != nil {
			return err
		}
	}
	if settings != nil {
		if err := vfs.write(container.AgentSettingsPath, settings, 0o600); err != nil {
			return err
		}
	}
	ud, _ := json.Marshal(map[string]any{
		"server":   map[string]string{"name": rec.CID},
		"registry": map[string]string{"endpoint": container.AgentSettingsPath},
	})
	md, _ := json.Marshal(map[string]any{"instance-id": rec.CID, "hostname": rec.CID})
	if err := vfs.write(container.UserDataJSONPath, ud, 0o600); err != nil {
		return err
	}
	if err := vfs.write(container.MetadataJSONPath, md, 0o600); err != nil {
		return err
	}
	// The VM's resolver: its networks' DNS, else the host's (a link the
	// image has there, into a resolver daemon's runtime dir, is replaced).
	if fi, err := vfs.root.Lstat("etc/resolv.conf"); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if err := vfs.root.Remove("etc/resolv.conf"); err != nil {
			return fmt.Errorf("replacing /etc/resolv.conf in the vm: %w", err)
		}
	}
	if err := vfs.write("/etc/resolv.conf", resolvConf(rec.Networks), 0o644); err != nil {
		return err
	}
	if err := vfs.shmInFstab(); err != nil {
		return err
	}
	if userData != "" {
		return vfs.write(container.UserDataPath, []byte(userData), 0o700)
	}
	return nil
}

// shmInFstab gives /dev/shm a line in the VM's /etc/fstab unless it has
// one. The agent remounts /dev/shm (mount -o remount,noexec,nodev,nosuid):
// without a line util-linux passes back the options the mount table shows,
// and tmpfs shows its owner as the host's uid, which the VM's user
// namespace refuses (EINVAL); with one, it passes the line's options.
func (vfs *vmFS) shmInFstab() error {
	b, err := vfs.root.ReadFile("etc/fstab")
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("reading /etc/fstab in the vm: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 1 && f[1] == "/dev/shm" && !strings.HasPrefix(f[0], "#") {
			return nil
		}
	}
	if len(b) > 0 && !strings.HasSuffix(string(b), "\n") {
		b = append(b, '\n')
	}
	return vfs.write("/etc/fstab", append(b, "tmpfs /dev/shm tmpfs defaults 0 0\n"...), 0o644)
}

// resolvConf is /etc/resolv.conf for a VM on nets: the DNS servers of the
// network that is the default for dns first, then the others', each once;
// none at all: the host's resolv.conf.
func resolvConf(nets driver.Networks) []byte {
	names := slices.Sorted(maps.Keys(nets))
	sort.SliceStable(names, func(i, j int) bool {
		return slices.Contains(nets[names[i]].Default, "dns") && !slices.Contains(nets[names[j]].Default, "dns")
	})
	var b strings.Builder
	seen := map[string]bool{}
	for _, name := range names {
		for _, s := range nets[name].DNS {
			if net.ParseIP(s) != nil && !seen[s] {
				seen[s] = true
				fmt.Fprintf(&b, "nameserver %s\n", s)
			}
		}
	}
	if b.Len() == 0 {
		host, err := os.ReadFile("/etc/resolv.conf")
		if err != nil {
			return nil
		}
		return host
	}
	return []byte(b.String())
}

// withAddresses answers the agent settings with the networks the VM got:
// a dynamic network's address is only known here.
func withAddresses(settings []byte, nets driver.Networks) []byte {
	var m map[string]any
	if settings == nil || json.Unmarshal(settings, &m) != nil || m == nil {
		return settings
	}
	n, _ := m["networks"].(map[string]any)
	if n == nil {
		n = map[string]any{}
	}
	for name, nw := range nets {
		entry, _ := n[name].(map[string]any)
		if entry == nil {
			entry = map[string]any{"type": nw.Type}
		}
		entry["ip"], entry["netmask"], entry["gateway"] = nw.IP, nw.Netmask, nw.Gateway
		// The driver configured the interface: the agent must not.
		entry["preconfigured"] = true
		n[name] = entry
	}
	m["networks"] = n
	b, err := json.Marshal(m)
	if err != nil {
		return settings
	}
	return b
}

// attachInside mounts a disk's data where the VM sees it, owned by the
// VM's ids (the disk keeps its own ids 0..65535, so it moves between
// VMs). devs belongs to the host's root; the mount point is made and the
// disk mounted on it without following any link.
func (v *VMs) attachInside(rec store.VM, disk string) (string, error) {
	if rec.IDs == nil {
		return "", errNoUserNS(rec.CID)
	}
	c := v.ctr(rec.CID)
	inside := container.DisksDir + "/" + disk
	if rec.DiskMounts == store.DiskMountsService {
		return inside, v.holdDisk(rec, disk)
	}
	if storage.IsMountPoint(filepath.Join(c.devs(), disk)) {
		return inside, nil // attached before
	}
	devs, err := os.OpenRoot(c.devs())
	if err != nil {
		return "", err
	}
	defer devs.Close()
	dr, err := v.st.LoadDisk(disk)
	if err != nil {
		return "", err
	}
	src := filepath.Join(v.st.Dir(store.Disks, disk), "data")
	if dr.Format == store.DiskFormatExt4 {
		// The image's file system, mounted aside only for as long as it
		// takes to mount a copy of it into the VM: that copy is all
		// there is of it while it is attached (its own device inside).
		src = filepath.Join(c.run(), ".disk-"+disk)
		if err := os.Mkdir(src, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return "", err
		}
		defer os.Remove(src)
		// Mounted twice, an ext4 is lost: not while another VM (or this
		// one, before) still holds it.
		if err := v.awaitFree(context.Background(), dr); err != nil {
			return "", err
		}
		if err := storage.MountLoop(filepath.Join(v.st.Dir(store.Disks, disk), store.DiskImage), src, unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
			return "", fmt.Errorf("mounting disk %s: %w", disk, err)
		}
		defer func() { _ = unix.Unmount(src, unix.MNT_DETACH) }()
	}
	if err := storage.BindIDMapped(src, devs, disk, *rec.IDs, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV); err != nil {
		return "", fmt.Errorf("mounting disk %s into vm %s: %w", disk, rec.CID, err)
	}
	return inside, nil
}

// holdDisk mounts a disk for a mount-service VM (mountservice.go) aside,
// in its supervisor's namespace, named as its agent settings name it.
func (v *VMs) holdDisk(rec store.VM, disk string) error {
	c := v.ctr(rec.CID)
	at, _ := c.diskMount(rec, disk)
	if storage.IsMountPoint(at) {
		return nil // attached before
	}
	dr, err := v.st.LoadDisk(disk)
	if err != nil {
		return err
	}
	if dr.Format != store.DiskFormatExt4 {
		return fmt.Errorf("disk %s is a directory, made in process mode: vm %s's stemcell mounts file systems only", disk, rec.CID)
	}
	if err := v.awaitFree(context.Background(), dr); err != nil {
		return err
	}
	image := filepath.Join(v.st.Dir(store.Disks, disk), store.DiskImage)
	for _, dir := range []string{c.held(), at} {
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	if err := storage.MountNamed(image, at, container.DisksDir+"/"+disk, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV); err != nil {
		return fmt.Errorf("mounting disk %s: %w", disk, err)
	}
	return nil
}

// detachInside unmounts a disk from the VM (it disappears inside at
// once), with every mount the VM made of it in any of its mount
// namespaces, and answers whether the VM still held its file system
// after that and was cut off from it (releaseDisk).
func (v *VMs) detachInside(rec store.VM, disk string) (cut bool, err error) {
	c := v.ctr(rec.CID)
	at, dir := c.diskMount(rec, disk)
	if dr, err := v.st.LoadDisk(disk); err == nil && dr.Format == store.DiskFormatExt4 && storage.IsMountPoint(at) {
		var st unix.Stat_t
		if err := unix.Stat(at, &st); err != nil {
			return false, err
		}
		// The image's own loop device: no other file system has it.
		if cut, err = v.releaseDisk(rec, at, filepath.Join(v.st.Dir(store.Disks, disk), store.DiskImage), st.Dev); err != nil {
			return cut, err
		}
	}
	if err := storage.Unmount(at); err != nil {
		return cut, err
	}
	devs, err := os.OpenRoot(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return cut, nil
	}
	if err != nil {
		return cut, err
	}
	defer devs.Close()
	if err := devs.Remove(disk); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return cut, err
	}
	return cut, nil
}

// settingsOf is the agent settings kept for a VM (its directory's copy,
// which the driver keeps current), nil when it was given none.
func (v *VMs) settingsOf(cid string) []byte {
	b, err := os.ReadFile(filepath.Join(v.st.Dir(store.VMs, cid), "agent-settings.json"))
	if err != nil {
		return nil
	}
	return b
}

// updateDiskSettings records an attached (path) or detached ("") disk in
// the VM's agent settings, as the warden CPI does: in its directory's
// copy, which its supervisor writes inside (syncSettings, and at every
// start).
func (v *VMs) updateDiskSettings(cid, disk, path string) error {
	b := v.settingsOf(cid)
	if b == nil {
		return nil // no settings given: nothing to keep current
	}
	var m map[string]any
	if json.Unmarshal(b, &m) != nil || m == nil {
		return nil
	}
	ds, _ := m["disks"].(map[string]any)
	if ds == nil {
		ds = map[string]any{}
	}
	p, _ := ds["persistent"].(map[string]any)
	if p == nil {
		p = map[string]any{}
	}
	if path == "" {
		delete(p, disk)
	} else {
		p[disk] = path
	}
	ds["persistent"] = p
	m["disks"] = ds
	out, err := json.Marshal(m)
	if err != nil {
		return err
	}
	return record.WriteFile(filepath.Join(v.st.Dir(store.VMs, cid), "agent-settings.json"), out)
}

// syncSettings writes the VM's agent settings inside it (in its mount
// namespace).
func (v *VMs) syncSettings(rec store.VM) error {
	b := v.settingsOf(rec.CID)
	if b == nil {
		return nil
	}
	vfs, err := v.openVMFS(rec)
	if err != nil {
		return err
	}
	defer vfs.Close()
	return vfs.write(container.AgentSettingsPath, b, 0o600)
}

// findExecutableIn checks the command exists in the VM's image.
func findExecutableIn(image, name string) error {
	root, err := os.OpenRoot(image)
	if err != nil {
		return err
	}
	defer root.Close()
	ok := func(p string) bool {
		st, err := root.Stat(strings.TrimPrefix(p, "/"))
		if err != nil {
			// An absolute symlink (/etc/alternatives) cannot be followed
			// inside a root: the VM's own exec will tell.
			return !errors.Is(err, fs.ErrNotExist)
		}
		return !st.IsDir() && st.Mode()&0o111 != 0
	}
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) || ok(name) {
			return nil
		}
		return fmt.Errorf("command %s is not an executable file in the stemcell", name)
	}
	if slices.ContainsFunc(filepath.SplitList(procs.VMPath), func(dir string) bool { return ok(filepath.Join(dir, name)) }) {
		return nil
	}
	return fmt.Errorf("command %q not found in the stemcell's %s", name, procs.VMPath)
}
