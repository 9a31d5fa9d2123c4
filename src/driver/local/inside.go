package local

import (
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
	"github.com/runway-cpi/runway/src/driver/local/storage"
)

// writeInside puts the agent settings and user data where a warden
// stemcell's bosh-agent reads them. The root is the VM's own file system,
// so every path is resolved inside it (os.Root): a symlink the image (or
// a running VM) planted cannot make bin/cpi write on the host.
func (d *Driver) writeInside(rec vmRecord, settings []byte, userData string) error {
	root, err := os.OpenRoot(d.ctr(rec.CID).rootfs())
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.MkdirAll(strings.TrimPrefix(filepath.Dir(container.AgentSettingsPath), "/"), 0o755); err != nil {
		return fmt.Errorf("making %s in the vm: %w", filepath.Dir(container.AgentSettingsPath), err)
	}
	if err := root.MkdirAll(strings.TrimPrefix(container.DisksDir, "/"), 0o755); err != nil {
		return fmt.Errorf("making %s in the vm: %w", container.DisksDir, err)
	}
	write := func(path string, b []byte, mode os.FileMode) error {
		if err := root.WriteFile(strings.TrimPrefix(path, "/"), b, mode); err != nil {
			return fmt.Errorf("writing %s in the vm: %w", path, err)
		}
		return nil
	}
	if settings != nil {
		if err := write(container.AgentSettingsPath, settings, 0o600); err != nil {
			return err
		}
	}
	ud, _ := json.Marshal(map[string]any{
		"server":   map[string]string{"name": rec.CID},
		"registry": map[string]string{"endpoint": container.AgentSettingsPath},
	})
	md, _ := json.Marshal(map[string]any{"instance-id": rec.CID, "hostname": rec.CID})
	if err := write(container.UserDataJSONPath, ud, 0o600); err != nil {
		return err
	}
	if err := write(container.MetadataJSONPath, md, 0o600); err != nil {
		return err
	}
	// The VM's resolver: its networks' DNS, else the host's (a link the
	// image has there, into a resolver daemon's runtime dir, is replaced).
	if fi, err := root.Lstat("etc/resolv.conf"); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		if err := root.Remove("etc/resolv.conf"); err != nil {
			return fmt.Errorf("replacing /etc/resolv.conf in the vm: %w", err)
		}
	}
	if err := write("/etc/resolv.conf", resolvConf(rec.Networks), 0o644); err != nil {
		return err
	}
	if userData != "" {
		return write(container.UserDataPath, []byte(userData), 0o700)
	}
	return nil
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

// attachInside mounts a disk's data directory where the VM sees it.
func (d *Driver) attachInside(vm, disk string) (string, error) {
	c := d.ctr(vm)
	target := filepath.Join(c.devs(), disk)
	if mps, _ := storage.MountsUnder(target); len(mps) > 0 {
		return container.DisksDir + "/" + disk, nil // attached before
	}
	if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", err
	}
	if err := unix.Mount(filepath.Join(d.path(disks, disk), "data"), target, "", unix.MS_BIND, ""); err != nil {
		return "", fmt.Errorf("mounting disk %s into vm %s: %w", disk, vm, err)
	}
	return container.DisksDir + "/" + disk, nil
}

// detachInside unmounts a disk from the VM (it disappears inside at once).
func (d *Driver) detachInside(vm, disk string) error {
	target := filepath.Join(d.ctr(vm).devs(), disk)
	if err := storage.UnmountAll(target); err != nil {
		return err
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// updateDiskSettings records an attached (path) or detached ("") disk in
// the agent settings inside the VM, as the warden CPI does.
func (d *Driver) updateDiskSettings(vm, disk, path string) error {
	root, err := os.OpenRoot(d.ctr(vm).rootfs())
	if err != nil {
		return err
	}
	defer root.Close()
	name := strings.TrimPrefix(container.AgentSettingsPath, "/")
	b, err := root.ReadFile(name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // no settings given: nothing to keep current
	}
	if err != nil {
		return err
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
	return root.WriteFile(name, out, 0o600)
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
	if slices.ContainsFunc(filepath.SplitList(vmPath), func(dir string) bool { return ok(filepath.Join(dir, name)) }) {
		return nil
	}
	return fmt.Errorf("command %q not found in the stemcell's %s", name, vmPath)
}
