package local

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/local/store"
	"github.com/runway-cpi/runway/src/driver/netprefix"
)

// CreateVM implements driver.Driver: planVM checks the request and
// decides everything, touching nothing; applyVM makes the VM.
func (d *Driver) CreateVM(ctx context.Context, spec driver.VMSpec) (driver.VM, error) {
	pl, err := d.planVM(spec)
	if err != nil {
		return driver.VM{}, err
	}
	return d.applyVM(ctx, pl)
}

// vmPlan is what create_vm decided before it makes anything.
type vmPlan struct {
	spec     driver.VMSpec
	cid      string
	props    store.VMProps
	argv     []string // nil: nothing runs (no command, or run_processes off)
	userData string
	agent    bool // with the BOSH agent profile
	// iso makes the VM: the configured isolation, or, when nothing runs
	// (run_processes off), the one that records VMs only.
	iso isolation
}

// planVM checks the request: names, the stemcell, disks, cloud
// properties, networks, and what the VM runs.
func (d *Driver) planVM(spec driver.VMSpec) (*vmPlan, error) {
	cid := spec.Name
	if cid == "" {
		var err error
		if cid, err = store.NewCID("vm-"); err != nil {
			return nil, &driver.CreationError{Err: err, Retryable: true}
		}
	}
	if err := store.CheckCID("vm", cid); err != nil {
		return nil, err
	}
	if err := store.CheckCID("stemcell", spec.StemcellCID); err != nil {
		return nil, err
	}
	if ok, err := d.st.Has(store.Stemcells, spec.StemcellCID); !ok || err != nil {
		return nil, fmt.Errorf("%w: %s", driver.ErrStemcellNotFound, spec.StemcellCID)
	}
	for _, disk := range spec.DiskCIDs {
		if err := store.CheckCID("disk", disk); err != nil {
			return nil, err
		}
	}
	props, err := store.DecodeVMProps(spec.CloudProps)
	if err != nil {
		return nil, err
	}
	if err := d.iso.Check(cid, props); err != nil {
		return nil, err
	}
	for name, n := range spec.Networks {
		if err := netprefix.CheckNoDelegation(n, name, "local"); err != nil {
			return nil, err
		}
		if !n.CloudProperties.Empty() {
			return nil, driver.Invalid("networks.%s.cloud_properties: the local driver takes none, got %s", name, n.CloudProperties.Raw())
		}
	}
	argv, userData, err := d.command(spec, props)
	if err != nil {
		return nil, err
	}
	// No command and no user data: the stemcell's init boots its agent.
	bootsAgent := (len(props.Command) == 0 || string(props.Command) == "null") && userData == ""
	agent, err := d.iso.AgentProfile(props, bootsAgent)
	if err != nil {
		return nil, err
	}
	iso := d.iso
	if run := d.cfg.RunProcesses == nil || *d.cfg.RunProcesses; !run {
		argv, iso = nil, d.idle
	}
	return &vmPlan{spec: spec, cid: cid, props: props, argv: argv, userData: userData, agent: agent, iso: iso}, nil
}

// applyVM builds the VM out of view, publishes it with one rename and
// starts it. The VM's lock is held from the first directory to the
// started process: delete_vm waits for a create in flight, and a sweeper
// that can take the lock knows the create is dead. What a failed call
// made is removed.
func (d *Driver) applyVM(ctx context.Context, pl *vmPlan) (driver.VM, error) {
	cid, spec := pl.cid, pl.spec
	unlock, err := d.st.Lock(ctx, store.VMs, cid)
	if err != nil {
		return driver.VM{}, &driver.CreationError{Err: err, Retryable: true}
	}
	defer unlock()
	tmp, err := d.st.Stage(store.VMs, cid, "disks", "ephemeral")
	if err != nil {
		return driver.VM{}, &driver.CreationError{Err: err, Retryable: true}
	}
	allocated, prepared := false, false
	rec := store.VM{
		CID: cid, AgentID: spec.AgentID, StemcellCID: spec.StemcellCID, CloudProps: spec.CloudProps,
		Tags: spec.Tags, Metadata: map[string]string{}, Command: pl.argv, CreatedAt: store.Now(),
	}
	fail := func(err error) (driver.VM, error) {
		if allocated {
			d.release(ctx, cid)
		}
		if prepared {
			pl.iso.Release(ctx, &rec)
		}
		_ = os.RemoveAll(tmp)
		return driver.VM{}, &driver.CreationError{Err: err, Retryable: true}
	}
	nets, err := d.ipam.Allocate(ctx, cid, pl.iso.Networks(spec.Networks))
	if err != nil {
		return fail(err)
	}
	allocated, rec.Networks = true, nets
	settings, err := pl.iso.Prepare(ctx, &rec, pl.agent, spec.AgentSettings)
	if err != nil {
		return fail(err)
	}
	prepared = true
	if settings != nil {
		if err := os.WriteFile(filepath.Join(tmp, "agent-settings.json"), settings, 0o600); err != nil {
			return fail(err)
		}
	}
	if pl.userData != "" {
		if err := os.WriteFile(filepath.Join(tmp, "user-data"), []byte(pl.userData), 0o700); err != nil {
			return fail(err)
		}
	}
	if err := d.st.Publish(store.VMs, cid, tmp, rec); err != nil {
		return fail(err)
	}
	if err := pl.iso.Start(ctx, rec, pl.props, settings, pl.userData); err != nil {
		// Leave nothing behind: the VM never ran.
		if derr := d.deleteLocked(ctx, cid); derr != nil {
			d.st.Log.Warn("removing the vm after its failed start failed", "vm", cid, "err", derr)
		}
		return driver.VM{}, &driver.CreationError{Err: err, Retryable: false}
	}
	return driver.VM{CID: cid, Networks: nets}, nil
}

// command resolves what the VM runs: cloud_properties.command (argv array
// or shell string), else a user-data script from cloud_properties.user_data
// or environment.user_data. No command: a VM with no process.
func (d *Driver) command(spec driver.VMSpec, p store.VMProps) ([]string, string, error) {
	var userData string
	if p.UserData != nil {
		userData = *p.UserData
	} else if v, ok := spec.Env["user_data"]; ok {
		s, ok := v.(string)
		if !ok {
			return nil, "", driver.Invalid("environment.user_data must be a string")
		}
		userData = s
	}
	if len(p.Command) > 0 && string(p.Command) != "null" {
		var shell string
		var argv []string
		switch {
		case json.Unmarshal(p.Command, &shell) == nil:
			if shell == "" {
				return nil, "", driver.Invalid("cloud_properties.command must not be empty")
			}
			return []string{d.cfg.Shell, "-c", shell}, userData, nil
		case json.Unmarshal(p.Command, &argv) == nil:
			if len(argv) == 0 || argv[0] == "" {
				return nil, "", driver.Invalid("cloud_properties.command must not be empty")
			}
			if err := d.iso.Executable(spec.StemcellCID, argv[0]); err != nil {
				return nil, "", &driver.CreationError{Err: err}
			}
			return argv, userData, nil
		default:
			return nil, "", driver.Invalid("cloud_properties.command must be a string or an array of strings")
		}
	}
	if userData != "" {
		script := d.iso.UserDataScript()
		if strings.HasPrefix(userData, "#!") {
			return []string{script}, userData, nil
		}
		return []string{d.cfg.Shell, script}, userData, nil
	}
	argv, err := d.iso.NoCommand(spec.StemcellCID)
	return argv, "", err
}
