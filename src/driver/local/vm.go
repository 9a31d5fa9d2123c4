package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/procs"
	"github.com/runway-cpi/runway/src/driver/local/store"
)

// DeleteVM implements driver.Driver: processes stopped for certain, disks
// detached, addresses released, directory removed.
func (d *Driver) DeleteVM(ctx context.Context, cid string) error {
	if err := store.CheckCID("vm", cid); err != nil {
		return err
	}
	unlock, err := d.st.Lock(ctx, store.VMs, cid)
	if err != nil {
		return err
	}
	defer unlock()
	return d.deleteLocked(ctx, cid)
}

// deleteLocked deletes a VM whose lock the caller holds. A VM with no
// record still gets its processes stopped (they are found by marker: a
// create killed at the wrong moment may have left some) before the answer
// is VMNotFound.
func (d *Driver) deleteLocked(ctx context.Context, cid string) error {
	defer d.st.Sweep(store.VMs)
	rec, err := d.st.LoadVM(cid)
	if err != nil {
		if serr := procs.Stop(ctx, cid, 0, d.grace()); serr != nil {
			return serr
		}
		return err
	}
	dir := d.st.Dir(store.VMs, cid)
	iso := d.isoOf(rec)
	if err := iso.Stop(ctx, rec); err != nil {
		return err
	}
	if err := iso.Teardown(rec); err != nil {
		return err
	}
	// Every disk whose record names the VM, linked or not (an attach
	// killed between its record and its link).
	attached, err := d.st.DisksAttachedTo(cid)
	if err != nil {
		return err
	}
	links, _ := os.ReadDir(filepath.Join(dir, "disks"))
	for _, l := range links {
		attached = append(attached, l.Name())
	}
	for _, disk := range attached {
		if err := d.clearAttachment(ctx, cid, disk); err != nil {
			return err
		}
	}
	d.release(ctx, cid)
	iso.Release(ctx, rec)
	if err := d.st.Remove(store.VMs, cid); err != nil {
		return fmt.Errorf("removing vm %s: %w", cid, err)
	}
	d.st.Log.Info("vm deleted", "vm", cid)
	return nil
}

// HasVM implements driver.Driver.
func (d *Driver) HasVM(_ context.Context, cid string) (bool, error) {
	return d.st.Has(store.VMs, cid)
}

// RebootVM implements driver.Driver: the process group is stopped and the
// command started again.
func (d *Driver) RebootVM(ctx context.Context, cid string) error {
	return d.restart(ctx, cid, true)
}

// StopVM stops the VM's processes and marks it stopped.
func (d *Driver) StopVM(ctx context.Context, cid string) error { return d.restart(ctx, cid, false) }

// StartVM starts a stopped VM's command again.
func (d *Driver) StartVM(ctx context.Context, cid string) error { return d.restart(ctx, cid, true) }

func (d *Driver) restart(ctx context.Context, cid string, start bool) error {
	rec, unlock, err := store.LockAndLoad[store.VM](ctx, d.st, store.VMs, cid)
	if err != nil {
		return err
	}
	defer unlock()
	iso := d.isoOf(rec)
	if start {
		if err := iso.CanStart(rec); err != nil {
			return err
		}
	}
	if err := iso.Stop(ctx, rec); err != nil {
		return err
	}
	rec.Stopped = !start
	if err := d.st.Save(store.VMs, cid, rec); err != nil {
		return err
	}
	if !start {
		return nil
	}
	props, err := store.DecodeVMProps(rec.CloudProps)
	if err != nil {
		return err
	}
	return iso.Restart(ctx, rec, props)
}

// SetVMMetadata implements driver.Driver.
func (d *Driver) SetVMMetadata(ctx context.Context, cid string, md map[string]string) error {
	return store.SetMetadata(ctx, d.st, store.VMs, cid, md, func(r *store.VM) *map[string]string { return &r.Metadata })
}

// ListVMs implements driver.Driver.
func (d *Driver) ListVMs(_ context.Context, match map[string]string) ([]driver.VMInfo, error) {
	entries, err := os.ReadDir(filepath.Join(d.st.Root, "vms"))
	if err != nil {
		return nil, err
	}
	var out []driver.VMInfo
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || !e.IsDir() {
			continue
		}
		rec, err := d.st.LoadVM(e.Name())
		if err != nil {
			continue // deleted meanwhile
		}
		ok := true
		for k, v := range match {
			ok = ok && rec.Tags[k] == v
		}
		if ok {
			out = append(out, driver.VMInfo{CID: rec.CID, AgentID: rec.AgentID, Tags: rec.Tags,
				Metadata: rec.Metadata, Networks: rec.Networks, State: d.state(rec)})
		}
	}
	return out, nil
}

// state: running while a process lives (or when there is none to run),
// stopped when stopped or the command exited 0, error on a failed exit.
func (d *Driver) state(rec *store.VM) string {
	if rec.Stopped {
		return "stopped"
	}
	if d.isoOf(rec).Running(rec) {
		return "running"
	}
	b, err := os.ReadFile(filepath.Join(d.st.Dir(store.VMs, rec.CID), "exit_status"))
	if err == nil && strings.TrimSpace(string(b)) != "0" {
		return "error"
	}
	return "stopped"
}
