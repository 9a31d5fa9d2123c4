package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// File system images: a disk (or the VMs' store) is an ext4 file system in
// a file, its whole size allocated when made (fallocate): what a VM writes
// there can never take the state dir's space, and a full image stops the
// writer, not the host. The kernel's loop driver mounts it (util-linux's
// mount sets the device to go with its last mount).

// toolPath is the PATH mkfs, mount, e2fsck and resize2fs run with.
const toolPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// tool runs an e2fsprogs or util-linux command, its output in the error.
func tool(ctx context.Context, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = []string{"PATH=" + toolPath}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}

// ImageKind is what an image holds.
type ImageKind int

const (
	// DiskImage: a persistent disk, journalled.
	DiskImage ImageKind = iota
	// LayerImage: a VM's writable layer, ephemeral (BOSH's ephemeral
	// disk): no journal.
	LayerImage
)

// MakeImage makes an ext4 image of sizeMiB at path (which must not
// exist), all of it the VM's (no blocks kept for the host's root), and
// all of it allocated unless sparse (a template to clone from).
func MakeImage(ctx context.Context, path string, sizeMiB int, kind ImageKind, sparse bool) error {
	if sparse {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		err = f.Truncate(int64(sizeMiB) << 20)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			_ = os.Remove(path)
			return err
		}
	} else if err := allocate(path, sizeMiB, os.O_CREATE|os.O_EXCL); err != nil {
		return err
	}
	args := []string{"-q", "-F", "-t", "ext4", "-m", "0", "-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"}
	if kind == LayerImage {
		args = append(args, "-O", "^has_journal")
	}
	if err := tool(ctx, "mkfs.ext4", append(args, path)...); err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

// allocate makes (or grows) file path to sizeMiB, every block allocated.
func allocate(path string, sizeMiB int, flags int) error {
	f, err := os.OpenFile(path, os.O_WRONLY|flags, 0o600)
	if err != nil {
		return err
	}
	err = unix.Fallocate(int(f.Fd()), 0, 0, int64(sizeMiB)<<20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		if flags&os.O_EXCL != 0 {
			_ = os.Remove(path)
		}
		return fmt.Errorf("allocating %d MiB for %s: %w", sizeMiB, path, err)
	}
	return nil
}

// CloneImage makes path a copy of template (a sparse image MakeImage
// made of the same size), copying only the blocks mkfs wrote and
// allocating the rest: a new file system in a few milliseconds instead of a mkfs.
func CloneImage(template, path string, sizeMiB int) error {
	if err := CopyImage(template, path); err != nil {
		return fmt.Errorf("copying %s: %w", template, err)
	}
	if err := allocate(path, sizeMiB, 0); err != nil {
		_ = os.Remove(path)
		return err
	}
	return nil
}

// copyData copies in's data regions (SEEK_DATA/SEEK_HOLE) to the same
// offsets of out, leaving its holes holes.
func copyData(in, out *os.File) error {
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	size := fi.Size()
	if err := out.Truncate(size); err != nil {
		return err
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		for o := data; o < hole; {
			r, w := o, o
			n, err := unix.CopyFileRange(int(in.Fd()), &r, int(out.Fd()), &w, int(hole-o), 0)
			if err != nil {
				return err
			}
			if n == 0 {
				return fmt.Errorf("short copy at %d", o)
			}
			o += int64(n)
		}
		off = hole
	}
	return nil
}

// MountLoop mounts the ext4 image at dir through a loop device that goes
// with the mount (autoclear), with mount flags and data.
func MountLoop(image, dir string, flags uintptr, data string) error {
	return withLoop(image, func(dev string) error {
		if err := unix.Mount(dev, dir, "ext4", flags, data); err != nil {
			return fmt.Errorf("mounting %s at %s: %w", image, dir, err)
		}
		return nil
	})
}

// withLoop sets a free loop device up for image (autoclear: it goes with
// its last mount) and runs mount with its path; the device is released
// when mount fails (nothing holds it then).
func withLoop(image string, mount func(dev string) error) error {
	img, err := os.OpenFile(image, os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer img.Close()
	lo, dev, err := freeLoop(img)
	if err != nil {
		return fmt.Errorf("a loop device for %s: %w", image, err)
	}
	err = mount(dev)
	lo.Close() // the mount holds the device now; autoclear frees it after
	return err
}

// lostRaces counts the free devices another process set up first.
var lostRaces atomic.Int64

// freeLoop sets a free loop device up for img, autoclear, and answers it
// open. The kernel answers every caller the same free device until one
// sets it up, so Runway's processes take turns under a lock on
// loop-control (the Director's parallel create_vm calls lost that race 20
// times in a row); a few tries remain for the host's other users.
func freeLoop(img *os.File) (*os.File, string, error) {
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR, 0)
	if err != nil {
		return nil, "", err
	}
	defer ctl.Close() // and the lock with it
	if err := unix.Flock(int(ctl.Fd()), unix.LOCK_EX); err != nil {
		return nil, "", fmt.Errorf("locking /dev/loop-control: %w", err)
	}
	for range 20 {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, "", fmt.Errorf("asking for a free device: %w", err)
		}
		dev := "/dev/loop" + strconv.Itoa(n)
		lo, err := os.OpenFile(dev, os.O_RDWR, 0)
		if err != nil {
			return nil, "", err
		}
		cfg := unix.LoopConfig{Fd: uint32(img.Fd())}
		cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
		err = unix.IoctlLoopConfigure(int(lo.Fd()), &cfg)
		if err == nil {
			return lo, dev, nil
		}
		lo.Close()
		if !errors.Is(err, unix.EBUSY) {
			return nil, "", fmt.Errorf("setting %s up: %w", dev, err)
		}
		lostRaces.Add(1)
	}
	return nil, "", errors.New("no free loop device after 20 tries: another program on the host keeps taking them")
}

// SourceOf answers the device mounted at dir (a loop device), from the
// mount table.
func SourceOf(dir string) (string, error) {
	b, err := os.ReadFile("/proc/thread-self/mountinfo")
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || UnescapeMount(f[4]) != dir {
			continue
		}
		for i, v := range f {
			if v == "-" && i+2 < len(f) {
				return UnescapeMount(f[i+2]), nil
			}
		}
	}
	return "", fmt.Errorf("nothing is mounted at %s", dir)
}

// GrowImage grows an image that is not mounted to sizeMiB, and its file
// system with it (checked first, as resize2fs asks). Online growth needs
// CAP_SYS_RESOURCE, which hosts such as ours withhold, and the CPI API has
// a disk detached for resize_disk anyway.
func GrowImage(ctx context.Context, image string, sizeMiB int) error {
	if err := allocate(image, sizeMiB, 0); err != nil {
		return err
	}
	if err := tool(ctx, "e2fsck", "-f", "-y", image); err != nil {
		var ee *exec.ExitError
		// 1: errors corrected; anything else is a real failure.
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			return err
		}
	}
	return tool(ctx, "resize2fs", image)
}

// CopyImage copies image src to dst (which must not exist), holes kept
// holes: a snapshot.
func CopyImage(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = copyData(in, out)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(dst)
	}
	return err
}

// Allocated answers the bytes of a file's allocated blocks.
func Allocated(path string) (int64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Blocks * 512, nil
}

const (
	fiFreeze = 0xc0045877 // _IOWR('X', 119, int)
	fiThaw   = 0xc0045878 // _IOWR('X', 120, int)
)

// Frozen runs f with the file system mounted at dir frozen (writes wait):
// a copy of its image taken meanwhile is consistent.
func Frozen(dir string, f func() error) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.IoctlSetPointerInt(int(d.Fd()), fiFreeze, 0); err != nil {
		return fmt.Errorf("freezing %s: %w", dir, err)
	}
	defer func() { _ = unix.IoctlSetPointerInt(int(d.Fd()), fiThaw, 0) }()
	return f()
}

// LoopsOf answers the loop devices whose backing file is image (the same
// inode): its file system is still mounted somewhere, or was lately (a
// device goes with its last mount, a moment after).
func LoopsOf(image string) ([]string, error) {
	var st unix.Stat_t
	if err := unix.Stat(image, &st); err != nil {
		return nil, err
	}
	bound, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, b := range bound {
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(b)))
		f, err := os.Open(dev)
		if err != nil {
			continue // gone since
		}
		info, err := unix.IoctlLoopGetStatus64(int(f.Fd()))
		f.Close()
		if err == nil && info.Device == st.Dev && info.Inode == st.Ino {
			out = append(out, dev)
		}
	}
	return out, nil
}

// AwaitFree waits (at most wait) until no loop device holds image, and
// names them when some still do.
func AwaitFree(ctx context.Context, image string, wait time.Duration) error {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.Now().Add(wait)
	for {
		loops, err := LoopsOf(image)
		if err != nil || len(loops) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %s still holds it", ErrInUse, strings.Join(loops, ", "))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// ErrInUse: an image a loop device still holds (mounted somewhere).
var ErrInUse = errors.New("the image is still mounted")
