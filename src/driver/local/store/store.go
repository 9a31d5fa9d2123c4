// Package store is the local driver's state dir: each resource kind's
// directory of records (VMs, disks, stemcells, snapshots), built out of
// view, published with one rename, deleted out of view, each resource
// under its lock; and the records themselves.
package store

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/record"
	"github.com/runway-cpi/runway/src/driver/local/storage"
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/logging"
)

// Store is one state dir: its root, its locks, the driver's log.
type Store struct {
	Root  string
	Locks *lock.Locker
	Log   logging.Fields
}

// Kind is one resource kind's place in the state dir: <dir>/<cid>/<record>,
// built in <dir>/.creating-<cid>, published with one rename, deleted by
// renaming to <dir>/.deleting-<cid> first, locked as "<name>-<cid>".
type Kind struct {
	name, dir, record string
	// notFound is the typed error for a missing resource (nil: only
	// deletes look, and a missing one is not an error there).
	notFound error
}

// The kinds.
var (
	VMs       = Kind{"vm", "vms", "vm.json", driver.ErrVMNotFound}
	Disks     = Kind{"disk", "disks", "disk.json", driver.ErrDiskNotFound}
	Stemcells = Kind{"stemcell", "stemcells", "stemcell.json", nil}
	Snapshots = Kind{"snapshot", "snapshots", "snapshot.json", nil}
)

// Dir is resource cid's directory.
func (s *Store) Dir(k Kind, cid string) string { return filepath.Join(s.Root, k.dir, cid) }

func (s *Store) recordPath(k Kind, cid string) string {
	return filepath.Join(s.Dir(k, cid), k.record)
}

// Load checks cid and reads its record; a missing one is k.notFound.
func Load[T any](s *Store, k Kind, cid string) (*T, error) {
	if err := CheckCID(k.name, cid); err != nil {
		return nil, err
	}
	var r T
	if err := record.Read(s.recordPath(k, cid), &r); err != nil {
		if isNotExist(err) && k.notFound != nil {
			return nil, fmt.Errorf("%w: %s", k.notFound, cid)
		}
		return nil, err
	}
	return &r, nil
}

// LockAndLoad checks cid, takes the resource's lock and loads its record;
// the caller releases the lock with unlock once done.
func LockAndLoad[T any](ctx context.Context, s *Store, k Kind, cid string) (rec *T, unlock func(), err error) {
	if err := CheckCID(k.name, cid); err != nil {
		return nil, nil, err
	}
	if unlock, err = s.Lock(ctx, k, cid); err != nil {
		return nil, nil, err
	}
	if rec, err = Load[T](s, k, cid); err != nil {
		unlock()
		return nil, nil, err
	}
	return rec, unlock, nil
}

// SetMetadata merges md into the metadata (of) of a VM's or disk's record.
func SetMetadata[T any](ctx context.Context, s *Store, k Kind, cid string, md map[string]string, of func(*T) *map[string]string) error {
	rec, unlock, err := LockAndLoad[T](ctx, s, k, cid)
	if err != nil {
		return err
	}
	defer unlock()
	m := of(rec)
	if *m == nil {
		*m = map[string]string{}
	}
	maps.Copy(*m, md)
	return s.Save(k, cid, rec)
}

// RemoveIfPresent deletes a resource under its lock; one already gone is
// not an error (the Director has nothing to swallow a not-found with).
func (s *Store) RemoveIfPresent(ctx context.Context, k Kind, cid string) error {
	if err := CheckCID(k.name, cid); err != nil {
		return err
	}
	unlock, err := s.Lock(ctx, k, cid)
	if err != nil {
		return err
	}
	defer unlock()
	defer s.Sweep(k)
	if ok, err := s.Has(k, cid); err != nil {
		return err
	} else if !ok {
		s.Log.Info("already gone", k.name, cid)
		return nil
	}
	return s.Remove(k, cid)
}

// Save replaces an existing resource's record.
func (s *Store) Save(k Kind, cid string, rec any) error {
	return record.Write(s.recordPath(k, cid), rec)
}

// Has checks cid and reports whether its record is there.
func (s *Store) Has(k Kind, cid string) (bool, error) {
	if err := CheckCID(k.name, cid); err != nil {
		return false, err
	}
	_, err := os.Stat(s.recordPath(k, cid))
	if isNotExist(err) {
		return false, nil
	}
	return err == nil, err
}

// Stage makes the out-of-view directory a new resource is built in (and
// its subdirectories), after sweeping what killed calls left.
func (s *Store) Stage(k Kind, cid string, sub ...string) (string, error) {
	s.Sweep(k)
	tmp := filepath.Join(s.Root, k.dir, ".creating-"+cid)
	for _, s := range append([]string{""}, sub...) {
		if err := os.MkdirAll(filepath.Join(tmp, s), 0o700); err != nil {
			_ = os.RemoveAll(tmp)
			return "", err
		}
	}
	return tmp, nil
}

// Publish writes rec into a staged directory and moves it into place;
// on failure the staged directory is removed.
func (s *Store) Publish(k Kind, cid, tmp string, rec any) error {
	err := record.Write(filepath.Join(tmp, k.record), rec)
	if err == nil {
		err = os.Rename(tmp, s.Dir(k, cid))
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
	}
	return err
}

// Remove takes a resource out of view first, then deletes it, so a crash
// mid-delete never leaves a half resource that looks whole.
func (s *Store) Remove(k Kind, cid string) error {
	trash := filepath.Join(s.Root, k.dir, ".deleting-"+cid)
	if err := os.Rename(s.Dir(k, cid), trash); err != nil {
		return err
	}
	return os.RemoveAll(trash)
}

// Lock takes the lock of one resource and returns its release, which
// prunes the lock file when the resource is gone by then (deleted, or
// never there), so lock files do not pile up per CID.
func (s *Store) Lock(ctx context.Context, k Kind, cid string) (func(), error) {
	name := k.name + "-" + cid
	release, err := s.Locks.Lock(ctx, name)
	if err != nil {
		return nil, err
	}
	return func() {
		_, err := os.Stat(s.Dir(k, cid))
		s.Locks.Release(name, release, isNotExist(err))
	}, nil
}

// LockNew makes a fresh CID for a resource of kind k about to be made
// (NewCID) and takes its lock.
func (s *Store) LockNew(ctx context.Context, k Kind, prefix string) (cid string, unlock func(), err error) {
	if cid, err = NewCID(prefix); err != nil {
		return "", nil, err
	}
	if unlock, err = s.Lock(ctx, k, cid); err != nil {
		return "", nil, err
	}
	return cid, unlock, nil
}

// Sweep removes the half-built (.creating-<cid>) and half-deleted
// (.deleting-<cid>) directories of one kind that killed calls left. Such a
// directory is removed only when its resource's lock is free: creators and
// deleters hold it throughout, so a free lock proves the call is dead —
// whatever its age. None holds a running process (processes start only
// after a VM is published, and are stopped before it is renamed away).
func (s *Store) Sweep(k Kind) {
	entries, err := os.ReadDir(filepath.Join(s.Root, k.dir))
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
		release, free, err := s.Locks.TryLock(name)
		if err != nil || !free {
			continue // in flight
		}
		if err := os.RemoveAll(filepath.Join(s.Root, k.dir, n)); err != nil {
			s.Log.Warn("removing what a killed call left failed", "path", n, "err", err)
		} else {
			s.Log.Info("removed what a killed call left", "path", k.dir+"/"+n)
		}
		s.Locks.Release(name, release, true)
	}
}

// CheckSpace answers NoDiskSpace when the state dir's file system cannot
// hold sizeMiB more and still keep its reserve free.
func (s *Store) CheckSpace(sizeMiB int) error {
	var st syscall.Statfs_t
	if err := syscall.Statfs(s.Root, &st); err != nil {
		return err
	}
	free := st.Bavail * uint64(st.Bsize) >> 20
	if uint64(sizeMiB)+storage.ReserveBytes>>20 > free {
		return fmt.Errorf("%w: %d MiB requested, %d MiB free in %s, %d MiB of which are kept free", driver.ErrNoDiskSpace,
			sizeMiB, free, s.Root, storage.ReserveBytes>>20)
	}
	return nil
}
