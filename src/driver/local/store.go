package local

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/record"
)

// kind is one resource kind's place in the state dir: <dir>/<cid>/<record>,
// built in <dir>/.creating-<cid>, published with one rename, deleted by
// renaming to <dir>/.deleting-<cid> first, locked as "<name>-<cid>".
type kind struct {
	name, dir, record string
	// notFound is the typed error for a missing resource (nil: only
	// deletes look, and a missing one is not an error there).
	notFound error
}

var (
	vms       = kind{"vm", "vms", "vm.json", driver.ErrVMNotFound}
	disks     = kind{"disk", "disks", "disk.json", driver.ErrDiskNotFound}
	stemcells = kind{"stemcell", "stemcells", "stemcell.json", nil}
	snapshots = kind{"snapshot", "snapshots", "snapshot.json", nil}
)

func (d *Driver) path(k kind, cid string) string { return filepath.Join(d.root, k.dir, cid) }

func (d *Driver) recordPath(k kind, cid string) string {
	return filepath.Join(d.path(k, cid), k.record)
}

// load checks cid and reads its record; a missing one is k.notFound.
func load[T any](d *Driver, k kind, cid string) (*T, error) {
	if err := checkCID(k.name, cid); err != nil {
		return nil, err
	}
	var r T
	if err := readJSON(d.recordPath(k, cid), &r); err != nil {
		if isNotExist(err) && k.notFound != nil {
			return nil, fmt.Errorf("%w: %s", k.notFound, cid)
		}
		return nil, err
	}
	return &r, nil
}

// lockAndLoad checks cid, takes the resource's lock and loads its record;
// the caller releases the lock with unlock once done.
func lockAndLoad[T any](ctx context.Context, d *Driver, k kind, cid string) (rec *T, unlock func(), err error) {
	if err := checkCID(k.name, cid); err != nil {
		return nil, nil, err
	}
	if unlock, err = d.lock(ctx, k, cid); err != nil {
		return nil, nil, err
	}
	if rec, err = load[T](d, k, cid); err != nil {
		unlock()
		return nil, nil, err
	}
	return rec, unlock, nil
}

// setMetadata merges md into the metadata (of) of a VM's or disk's record.
func setMetadata[T any](ctx context.Context, d *Driver, k kind, cid string, md map[string]string, of func(*T) *map[string]string) error {
	rec, unlock, err := lockAndLoad[T](ctx, d, k, cid)
	if err != nil {
		return err
	}
	defer unlock()
	m := of(rec)
	if *m == nil {
		*m = map[string]string{}
	}
	maps.Copy(*m, md)
	return d.save(k, cid, rec)
}

// removeIfPresent deletes a resource under its lock; one already gone is
// not an error (the Director has nothing to swallow a not-found with).
func (d *Driver) removeIfPresent(ctx context.Context, k kind, cid string) error {
	if err := checkCID(k.name, cid); err != nil {
		return err
	}
	unlock, err := d.lock(ctx, k, cid)
	if err != nil {
		return err
	}
	defer unlock()
	defer d.sweep(k)
	if ok, err := d.has(k, cid); err != nil {
		return err
	} else if !ok {
		d.log.Info("already gone", k.name, cid)
		return nil
	}
	return d.remove(k, cid)
}

// save replaces an existing resource's record.
func (d *Driver) save(k kind, cid string, rec any) error {
	return writeJSON(d.recordPath(k, cid), rec)
}

// has checks cid and reports whether its record is there.
func (d *Driver) has(k kind, cid string) (bool, error) {
	if err := checkCID(k.name, cid); err != nil {
		return false, err
	}
	_, err := os.Stat(d.recordPath(k, cid))
	if isNotExist(err) {
		return false, nil
	}
	return err == nil, err
}

// stage makes the out-of-view directory a new resource is built in (and
// its subdirectories), after sweeping what killed calls left.
func (d *Driver) stage(k kind, cid string, sub ...string) (string, error) {
	d.sweep(k)
	tmp := filepath.Join(d.root, k.dir, ".creating-"+cid)
	for _, s := range append([]string{""}, sub...) {
		if err := os.MkdirAll(filepath.Join(tmp, s), 0o700); err != nil {
			_ = os.RemoveAll(tmp)
			return "", err
		}
	}
	return tmp, nil
}

// publish writes rec into a staged directory and moves it into place;
// on failure the staged directory is removed.
func (d *Driver) publish(k kind, cid, tmp string, rec any) error {
	err := writeJSON(filepath.Join(tmp, k.record), rec)
	if err == nil {
		err = os.Rename(tmp, d.path(k, cid))
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
	}
	return err
}

// remove takes a resource out of view first, then deletes it, so a crash
// mid-delete never leaves a half resource that looks whole.
func (d *Driver) remove(k kind, cid string) error {
	trash := filepath.Join(d.root, k.dir, ".deleting-"+cid)
	if err := os.Rename(d.path(k, cid), trash); err != nil {
		return err
	}
	return os.RemoveAll(trash)
}

// lock takes the lock of one resource and returns its release, which
// prunes the lock file when the resource is gone by then (deleted, or
// never there), so lock files do not pile up per CID.
func (d *Driver) lock(ctx context.Context, k kind, cid string) (func(), error) {
	name := k.name + "-" + cid
	release, err := d.locks.Lock(ctx, name)
	if err != nil {
		return nil, err
	}
	return func() {
		_, err := os.Stat(d.path(k, cid))
		d.locks.Release(name, release, isNotExist(err))
	}, nil
}

// sweep removes the half-built (.creating-<cid>) and half-deleted
// (.deleting-<cid>) directories of one kind that killed calls left. Such a
// directory is removed only when its resource's lock is free: creators and
// deleters hold it throughout, so a free lock proves the call is dead —
// whatever its age. None holds a running process (processes start only
// after a VM is published, and are stopped before it is renamed away).
func (d *Driver) sweep(k kind) {
	entries, err := os.ReadDir(filepath.Join(d.root, k.dir))
	if err != nil {
		return
	}
	for _, e := range entries {
		n := e.Name()
		cid, ok := strings.CutPrefix(n, ".creating-")
		if !ok {
			if cid, ok = strings.CutPrefix(n, ".deleting-"); !ok {
				continue
			}
		}
		name := k.name + "-" + cid
		release, free, err := d.locks.TryLock(name)
		if err != nil || !free {
			continue // in flight
		}
		if err := os.RemoveAll(filepath.Join(d.root, k.dir, n)); err != nil {
			d.log.Warn("removing what a killed call left failed", "path", n, "err", err)
		} else {
			d.log.Info("removed what a killed call left", "path", k.dir+"/"+n)
		}
		d.locks.Release(name, release, true)
	}
}

var (
	readJSON        = record.Read
	writeJSON       = record.Write
	writeFileAtomic = record.WriteFile
)
