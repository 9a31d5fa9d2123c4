package storage

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// MountsUnder lists the mount points at or below dir, innermost first.
// The mount table read is the calling thread's: a goroutine that ended
// locked in another root or mount namespace (MountNamed, a VM's) may have
// left the main thread there, and /proc/self shows the main thread's.
func MountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return nil, err
	}
	return mountPoints(b, func(f []string) bool {
		mp := UnescapeMount(f[4])
		return mp == dir || strings.HasPrefix(mp, dir+"/")
	}), nil
}

// MountsOf lists the mount points in a mountinfo table (another
// process's) whose file system is the device dev, innermost first.
func MountsOf(info []byte, dev uint64) []string {
	return mountPoints(info, func(f []string) bool {
		var maj, min uint32
		_, err := fmt.Sscanf(f[2], "%d:%d", &maj, &min)
		return err == nil && unix.Mkdev(maj, min) == dev
	})
}

// mountPoints lists the mount points of the mountinfo lines keep takes,
// deepest first; a path mounted twice is listed twice.
func mountPoints(info []byte, keep func(fields []string) bool) []string {
	var out []string
	for _, line := range strings.Split(string(info), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || !keep(f) {
			continue
		}
		out = append(out, UnescapeMount(f[4]))
	}
	sort.SliceStable(out, func(i, j int) bool { return strings.Count(out[i], "/") > strings.Count(out[j], "/") })
	return out
}

// UnescapeMount undoes mountinfo's octal escapes (\040 for a space).
func UnescapeMount(s string) string {
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

// UnmountAll unmounts everything at or below dir and checks none is left.
func UnmountAll(dir string) error {
	for range 3 {
		mps, err := MountsUnder(dir)
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
	if mps, _ := MountsUnder(dir); len(mps) > 0 {
		return fmt.Errorf("still mounted after unmounting: %s", strings.Join(mps, ", "))
	}
	return nil
}

// NoMountsIn checks, by device, that nothing within depth levels below
// dir is a mount point (the mount table lists resolved paths only); a dir
// that is gone holds none.
func NoMountsIn(dir string, depth int) error {
	var top unix.Stat_t
	if err := unix.Lstat(dir, &top); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return err
	}
	var walk func(p string, left int) error
	walk = func(p string, left int) error {
		ents, err := os.ReadDir(p)
		if err != nil {
			return nil // not a directory, or gone
		}
		for _, e := range ents {
			q := p + "/" + e.Name()
			var st unix.Stat_t
			if unix.Lstat(q, &st) != nil {
				continue
			}
			if st.Dev != top.Dev {
				return fmt.Errorf("%s is still a mount point", q)
			}
			if left > 1 && e.IsDir() {
				if err := walk(q, left-1); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(dir, depth)
}

// IsMountPoint reports whether path is the root of a mount (statx: one
// syscall, not a read of a mount table that grows with every VM). A path
// that is not there is not one.
func IsMountPoint(path string) bool {
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_BASIC_STATS, &st); err != nil {
		return false
	}
	return st.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT != 0 && st.Attributes&unix.STATX_ATTR_MOUNT_ROOT != 0
}

// Unmount detaches the mounts at the given paths, innermost first as
// given; one that is not mounted (or not there) is no error.
func Unmount(paths ...string) error {
	for _, p := range paths {
		for IsMountPoint(p) { // a path mounted twice
			if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				return fmt.Errorf("unmounting %s: %w", p, err)
			}
		}
	}
	return nil
}

// MountsFrom lists the mount points in a mountinfo table whose source
// (the device as the table names it) begins with prefix.
func MountsFrom(info []byte, prefix string) []string {
	return mountPoints(info, func(f []string) bool {
		sep := slices.Index(f, "-")
		return sep > 0 && sep+2 < len(f) && strings.HasPrefix(UnescapeMount(f[sep+2]), prefix)
	})
}

// NSFileMounts lists the mount points in a mountinfo table where a mount
// namespace's file is bind-mounted (what keeps a namespace with no
// process in it).
func NSFileMounts(info []byte) []string {
	var out []string
	for _, line := range strings.Split(string(info), "\n") {
		f := strings.Fields(line)
		sep := slices.Index(f, "-")
		if sep < 5 || sep+1 >= len(f) || f[sep+1] != "nsfs" || !strings.HasPrefix(f[3], "mnt:[") {
			continue
		}
		out = append(out, UnescapeMount(f[4]))
	}
	return out
}
