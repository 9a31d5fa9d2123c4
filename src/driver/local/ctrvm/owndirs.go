package ctrvm

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/container"
	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// A BOSH agent binds directories over /var/log, /opt and /var/opt (from
// /var/vcap/data) and /home (over itself), then remounts each `mount DIR
// -o remount -o nodev …`, without MS_BIND (bosh-agent:
// platform/linux_platform.go bindMountDir, SetupHomeDir). Such a remount
// reconfigures the file system's superblock, which the kernel allows only
// to a holder of CAP_SYS_ADMIN in the user namespace that mounted it: for
// the VM's root overlay, mounted by the host, the VM's root is refused
// ("permission denied") and the agent stops at its first boot. So an
// agent VM's /var/vcap/data and /home — the sources of those binds — are
// file systems the runtime makes inside the VM's user namespace
// (container.OwnMount), as a warden VM's /var/vcap/data is a file system
// of its own (its ephemeral disk). Nothing widens: the VM's root could
// mount such an overlay itself, and it holds only the VM's own image and
// layer.

// agentOwnDirs are the directories an agent VM gets as its own.
var agentOwnDirs = []string{"/var/vcap/data", "/home"}

// ownMounts are the VM's own file systems: for an agent VM made since
// they exist (rec.OwnDirs), each directory of agentOwnDirs its image has
// as a directory (no link on the way: the overlay's lower directory is
// resolved on the host).
func (v *VMs) ownMounts(rec store.VM) []container.OwnMount {
	if !rec.OwnDirs {
		return nil
	}
	image := v.st.ImageDir(rec.StemcellCID)
	var out []container.OwnMount
	for _, dir := range agentOwnDirs {
		if !realDir(image, dir) {
			continue
		}
		// Relative to the VM's root file system's directory, where the
		// runtime mounts from (runc's init runs there): the options the
		// VM reads in its mount table name no host path.
		own := filepath.Join("..", "layer", ownDir(dir))
		out = append(out, container.OwnMount{Dest: dir, Lower: filepath.Join("..", "image", dir),
			Upper: filepath.Join(own, "upper"), Work: filepath.Join(own, "work")})
	}
	return out
}

// ownDir is where the layer keeps dir's upper and work directories.
func ownDir(dir string) string {
	return filepath.Join("own", strings.ReplaceAll(strings.Trim(dir, "/"), "/", "-"))
}

// realDir: each component of dir below root is a directory, not a link.
func realDir(root, dir string) bool {
	p := root
	for _, part := range strings.Split(strings.Trim(dir, "/"), "/") {
		p = filepath.Join(p, part)
		if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
			return false
		}
	}
	return true
}

// makeOwnDirs makes the upper and work directories of the VM's own file
// systems in its writable layer (mounted at layer under run): the VM's
// root makes the overlays, so they are its own; each upper one owned and
// moded as the image's directory is seen by the VM (the overlay's root
// takes them).
func makeOwnDirs(own []container.OwnMount, run *os.Root, ids storage.IDRange, image string) error {
	if len(own) == 0 {
		return nil
	}
	root := int(ids.Base)
	if err := storage.MkdirOwned(run, "layer/own", 0o711, 0, 0); err != nil {
		return err
	}
	for _, m := range own {
		fi, err := os.Stat(filepath.Join(image, m.Dest))
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return driver.Invalid("the stemcell image has no owner")
		}
		dir := filepath.Join("layer", ownDir(m.Dest))
		if err := storage.MkdirOwned(run, dir, 0o700, root, root); err != nil {
			return err
		}
		if err := storage.MkdirOwned(run, filepath.Join(dir, "work"), 0o700, root, root); err != nil {
			return err
		}
		upper := filepath.Join(dir, "upper")
		if err := storage.MkdirOwned(run, upper, fi.Mode()&(os.ModePerm|os.ModeSticky), int(ids.Base+st.Uid), int(ids.Base+st.Gid)); err != nil {
			return err
		}
	}
	return nil
}
