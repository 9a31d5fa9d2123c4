package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/container"
	"github.com/runway-cpi/runway/src/driver/local/storage"
)

// vmRecord is vms/<cid>/vm.json. The environment is not kept here: it may
// hold secrets and reaches the VM through its settings file only.
type vmRecord struct {
	CID         string            `json:"cid"`
	AgentID     string            `json:"agent_id"`
	StemcellCID string            `json:"stemcell_cid"`
	CloudProps  driver.Props      `json:"cloud_properties"`
	Networks    driver.Networks   `json:"networks"`
	Tags        map[string]string `json:"tags"`
	Metadata    map[string]string `json:"metadata"`
	Command     []string          `json:"command,omitempty"`
	// Isolation is "container" for a container VM (the config may change
	// while it lives; deleting it must still undo what made it).
	Isolation string `json:"isolation,omitempty"`
	// IDs is a container VM's range of host ids (its user namespace).
	IDs *storage.IDRange `json:"ids,omitempty"`
	// Port: a container VM's host-side interface.
	Port string `json:"port,omitempty"`
	// Agent: the VM has the BOSH agent profile.
	Agent bool `json:"agent,omitempty"`
	// OwnDirs: the agent VM's /var/vcap/data and /home are file systems of
	// its own (owndirs.go); a VM made before they were keeps its writes
	// there in its root's layer.
	OwnDirs bool `json:"own_dirs,omitempty"`
	// DiskMounts: how a container VM gets its persistent disks, from its
	// stemcell: "" (bind) or diskMountsService (mountservice.go).
	DiskMounts string `json:"disk_mounts,omitempty"`
	Stopped    bool   `json:"stopped,omitempty"`
	CreatedAt  string `json:"created_at"`
}

// loadVM reads a VM record; a missing VM is ErrVMNotFound.
func (d *Driver) loadVM(cid string) (*vmRecord, error) { return load[vmRecord](d, vms, cid) }

// vmPath is the PATH VM processes get.
const vmPath = container.VMPath

func (d *Driver) grace() time.Duration { return time.Duration(d.cfg.StopGraceSeconds) * time.Second }

// DeleteVM implements driver.Driver: processes stopped for certain, disks
// detached, addresses released, directory removed.
func (d *Driver) DeleteVM(ctx context.Context, cid string) error {
	if err := checkCID("vm", cid); err != nil {
		return err
	}
	unlock, err := d.lock(ctx, vms, cid)
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
	defer d.sweep(vms)
	rec, err := d.loadVM(cid)
	if err != nil {
		if serr := stopVM(ctx, cid, 0, d.grace()); serr != nil {
			return serr
		}
		return err
	}
	dir := d.path(vms, cid)
	iso := d.isoOf(rec)
	if err := iso.stop(ctx, rec); err != nil {
		return err
	}
	if err := iso.teardown(rec); err != nil {
		return err
	}
	// Every disk whose record names the VM, linked or not (an attach
	// killed between its record and its link).
	attached, err := d.disksAttachedTo(cid)
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
	if rec.IDs != nil {
		d.releaseIDs(ctx, cid)
	}
	if err := d.remove(vms, cid); err != nil {
		return fmt.Errorf("removing vm %s: %w", cid, err)
	}
	d.log.Info("vm deleted", "vm", cid)
	return nil
}

// HasVM implements driver.Driver.
func (d *Driver) HasVM(_ context.Context, cid string) (bool, error) {
	return d.has(vms, cid)
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
	rec, unlock, err := lockAndLoad[vmRecord](ctx, d, vms, cid)
	if err != nil {
		return err
	}
	defer unlock()
	iso := d.isoOf(rec)
	if _, ok := iso.(containerVMs); ok && start && !d.containers() {
		return fmt.Errorf("vm %s was made in container mode: starting it needs local.isolation \"container\" (deleting it does not)", cid)
	}
	if err := iso.stop(ctx, rec); err != nil {
		return err
	}
	rec.Stopped = !start
	if err := d.save(vms, cid, rec); err != nil {
		return err
	}
	if !start {
		return nil
	}
	props, err := decodeVMProps(rec.CloudProps)
	if err != nil {
		return err
	}
	return iso.restart(ctx, rec, props)
}

// SetVMMetadata implements driver.Driver.
func (d *Driver) SetVMMetadata(ctx context.Context, cid string, md map[string]string) error {
	return setMetadata(ctx, d, vms, cid, md, func(r *vmRecord) *map[string]string { return &r.Metadata })
}

// ListVMs implements driver.Driver.
func (d *Driver) ListVMs(_ context.Context, match map[string]string) ([]driver.VMInfo, error) {
	entries, err := os.ReadDir(filepath.Join(d.root, "vms"))
	if err != nil {
		return nil, err
	}
	var out []driver.VMInfo
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") || !e.IsDir() {
			continue
		}
		rec, err := d.loadVM(e.Name())
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
func (d *Driver) state(rec *vmRecord) string {
	dir := d.path(vms, rec.CID)
	if rec.Stopped {
		return "stopped"
	}
	if (len(rec.Command) == 0 && rec.Isolation == "") || len(liveMembers(readPGID(dir), rec.CID)) > 0 {
		return "running"
	}
	b, err := os.ReadFile(filepath.Join(dir, "exit_status"))
	if err == nil && strings.TrimSpace(string(b)) != "0" {
		return "error"
	}
	return "stopped"
}
