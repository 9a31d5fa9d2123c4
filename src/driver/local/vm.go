package local

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/runway-cpi/runway/src/driver"
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
	Stopped   bool   `json:"stopped,omitempty"`
	CreatedAt string `json:"created_at"`
}

// loadVM reads a VM record; a missing VM is ErrVMNotFound.
func (d *Driver) loadVM(cid string) (*vmRecord, error) { return load[vmRecord](d, vms, cid) }

// CreateVM implements driver.Driver.
func (d *Driver) CreateVM(ctx context.Context, spec driver.VMSpec) (driver.VM, error) {
	cid := spec.Name
	if cid == "" {
		var err error
		if cid, err = newCID("vm-"); err != nil {
			return driver.VM{}, &driver.CreationError{Err: err, Retryable: true}
		}
	}
	if err := checkCID("vm", cid); err != nil {
		return driver.VM{}, err
	}
	if d.containers() && len(cid) >= maxHostname {
		return driver.VM{}, driver.Invalid("vm cid %q is too long for a container's hostname (at most %d bytes)", cid, maxHostname-1)
	}
	if err := checkCID("stemcell", spec.StemcellCID); err != nil {
		return driver.VM{}, err
	}
	if ok, err := d.has(stemcells, spec.StemcellCID); !ok || err != nil {
		return driver.VM{}, fmt.Errorf("%w: %s", driver.ErrStemcellNotFound, spec.StemcellCID)
	}
	for _, disk := range spec.DiskCIDs {
		if err := checkCID("disk", disk); err != nil {
			return driver.VM{}, err
		}
	}
	props, err := decodeVMProps(spec.CloudProps)
	if err != nil {
		return driver.VM{}, err
	}
	if props.BoshAgent != nil && *props.BoshAgent && !d.containers() {
		return driver.VM{}, driver.Invalid(`cloud_properties.bosh_agent needs local.isolation "container" (a process VM cannot host an agent)`)
	}
	for name, n := range spec.Networks {
		if err := n.CheckNoDelegation(name, "local"); err != nil {
			return driver.VM{}, err
		}
		if !n.CloudProperties.Empty() {
			return driver.VM{}, driver.Invalid("networks.%s.cloud_properties: the local driver takes none, got %s", name, n.CloudProperties.Raw())
		}
	}
	argv, userData, err := d.command(spec, props)
	if err != nil {
		return driver.VM{}, err
	}
	run := d.cfg.RunProcesses == nil || *d.cfg.RunProcesses
	if !run {
		argv = nil
	}
	container := d.containers() && run

	// The VM's lock is held from the first directory to the started
	// process: delete_vm waits for a create in flight, and a sweeper that
	// can take the lock knows the create is dead.
	unlock, err := d.lock(ctx, vms, cid)
	if err != nil {
		return driver.VM{}, &driver.CreationError{Err: err, Retryable: true}
	}
	defer unlock()
	// Build the VM out of view, then publish it with one rename.
	tmp, err := d.stage(vms, cid, "disks", "ephemeral")
	if err != nil {
		return driver.VM{}, &driver.CreationError{Err: err, Retryable: true}
	}
	allocated := false
	fail := func(err error, retryable bool) (driver.VM, error) {
		if allocated {
			d.release(ctx, cid)
		}
		_ = os.RemoveAll(tmp)
		return driver.VM{}, &driver.CreationError{Err: err, Retryable: retryable}
	}
	want := spec.Networks
	if container && len(want) == 0 {
		// Every container VM has its address (callers such as the
		// orchestrator name no network).
		want = driver.Networks{"default": {Type: "dynamic"}}
	}
	nets, err := d.allocate(ctx, cid, want)
	if err != nil {
		return fail(err, true)
	}
	allocated = true
	rec := vmRecord{
		CID: cid, AgentID: spec.AgentID, StemcellCID: spec.StemcellCID, CloudProps: spec.CloudProps,
		Networks: nets, Tags: spec.Tags, Metadata: map[string]string{}, Command: argv, CreatedAt: now(),
	}
	settings := spec.AgentSettings
	if container {
		rec.Isolation = IsolationContainer
		settings = withAddresses(settings, nets)
	}
	if settings != nil {
		if err := os.WriteFile(filepath.Join(tmp, "agent-settings.json"), settings, 0o600); err != nil {
			return fail(err, true)
		}
	}
	if userData != "" {
		if err := os.WriteFile(filepath.Join(tmp, "user-data"), []byte(userData), 0o700); err != nil {
			return fail(err, true)
		}
	}
	if err := d.publish(vms, cid, tmp, rec); err != nil {
		return fail(err, true)
	}
	if container {
		if err := d.runContainer(ctx, rec, props, settings, userData); err != nil {
			// Leave nothing behind: the VM never ran.
			if derr := d.deleteLocked(ctx, cid); derr != nil {
				d.log.Warn("local", "removing vm %s after its failed start: %v", cid, derr)
			}
			return driver.VM{}, &driver.CreationError{Err: err, Retryable: false}
		}
		d.log.Info("local", "vm %s started in a container", cid)
		return driver.VM{CID: cid, Networks: nets}, nil
	}
	if len(argv) > 0 {
		if err := startProcess(d.path(vms, cid), argv, d.processEnv(rec, props)); err != nil {
			// Leave nothing behind: the VM never ran.
			_ = d.deleteLocked(ctx, cid)
			return driver.VM{}, &driver.CreationError{Err: err, Retryable: false}
		}
		d.log.Info("local", "vm %s started: %s", cid, strings.Join(redactArgv(argv), " "))
	}
	return driver.VM{CID: cid, Networks: nets}, nil
}

// vmProps are the local driver's VM cloud properties.
type vmProps struct {
	// Command is an argv array or a shell string.
	Command  json.RawMessage   `json:"command,omitempty"`
	UserData *string           `json:"user_data,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	// BoshAgent: the VM hosts a BOSH agent (container mode): it gets the
	// agent profile's capabilities (container.go) and, with no command,
	// the stemcell's agent is started. Unset: container.bosh_agent.
	BoshAgent *bool `json:"bosh_agent,omitempty"`
	// What calculate_vm_cloud_properties answers comes back here: recorded.
	CPU               int `json:"cpu,omitempty"`
	RAM               int `json:"ram,omitempty"`
	EphemeralDiskSize int `json:"ephemeral_disk_size,omitempty"`
}

func decodeVMProps(p driver.Props) (vmProps, error) {
	var v vmProps
	return v, p.Decode("cloud_properties", &v)
}

// command resolves what the VM runs: cloud_properties.command (argv array
// or shell string), else a user-data script from cloud_properties.user_data
// or environment.user_data. No command: a VM with no process.
func (d *Driver) command(spec driver.VMSpec, p vmProps) ([]string, string, error) {
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
			check := findExecutable
			if d.containers() {
				image := filepath.Join(d.path(stemcells, spec.StemcellCID), "image")
				check = func(name string) error { return findExecutableIn(image, name) }
			}
			if err := check(argv[0]); err != nil {
				return nil, "", &driver.CreationError{Err: err}
			}
			return argv, userData, nil
		default:
			return nil, "", driver.Invalid("cloud_properties.command must be a string or an array of strings")
		}
	}
	if userData != "" {
		script := "./user-data"
		if d.containers() {
			script = userDataPath
		}
		if strings.HasPrefix(userData, "#!") {
			return []string{script}, userData, nil
		}
		return []string{d.cfg.Shell, script}, userData, nil
	}
	if d.containers() {
		// No command: the stemcell's own init, as the warden CPI starts it.
		image := filepath.Join(d.path(stemcells, spec.StemcellCID), "image")
		if err := findExecutableIn(image, agentInit); err != nil {
			return nil, "", &driver.CreationError{Err: fmt.Errorf("the vm has no command (cloud_properties.command or user_data) and stemcell %s has no %s to start its agent: %w", spec.StemcellCID, agentInit, err)}
		}
		return agentBoot, "", nil
	}
	return nil, "", nil
}

// agentProfile: whether a VM gets the BOSH agent's capabilities.
func (d *Driver) agentProfile(p vmProps) bool {
	if p.BoshAgent != nil {
		return *p.BoshAgent
	}
	return d.cfg.Container.BoshAgent
}

// processEnv is the VM process's whole environment: nothing of bin/cpi's
// own environment (which may hold credentials) is inherited.
func (d *Driver) processEnv(rec vmRecord, p vmProps) []string {
	dir := d.path(vms, rec.CID)
	env := map[string]string{
		"PATH":                  "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME":                  dir,
		"RUNWAY_VM_DIR":         dir,
		envMarker:               rec.CID,
		"RUNWAY_AGENT_ID":       rec.AgentID,
		"RUNWAY_DISKS_DIR":      filepath.Join(dir, "disks"),
		"RUNWAY_EPHEMERAL_DIR":  filepath.Join(dir, "ephemeral"),
		"RUNWAY_STEMCELL_DIR":   filepath.Join(d.path(stemcells, rec.StemcellCID), "image"),
		"RUNWAY_AGENT_SETTINGS": filepath.Join(dir, "agent-settings.json"),
	}
	for k, v := range p.Env {
		if k != envMarker && k != "RUNWAY_VM_DIR" {
			env[k] = v
		}
	}
	out := make([]string, 0, len(env))
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	sort.Strings(out)
	return out
}

// vmPath is the PATH VM processes get.
const vmPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// findExecutable checks the command exists before the VM is made: once it
// is started detached, a failed exec could only show in the console log.
func findExecutable(name string) error {
	if strings.Contains(name, "/") {
		if !filepath.IsAbs(name) {
			return nil // relative to the VM directory: checked by the process
		}
		if st, err := os.Stat(name); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return fmt.Errorf("command %s is not an executable file", name)
		}
		return nil
	}
	for _, dir := range filepath.SplitList(vmPath) {
		if st, err := os.Stat(filepath.Join(dir, name)); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return nil
		}
	}
	return fmt.Errorf("command %q not found in %s", name, vmPath)
}

func redactArgv(argv []string) []string {
	if len(argv) > 3 {
		return append(append([]string{}, argv[:3]...), "...")
	}
	return argv
}

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
	switch {
	case rec.Isolation == IsolationContainer:
		if err := d.stopContainer(ctx, cid); err != nil {
			return err
		}
		if err := d.teardownContainer(cid); err != nil {
			return err
		}
	case len(rec.Command) > 0: // a VM without a command never had a process
		if err := stopVM(ctx, cid, readPGID(dir), d.grace()); err != nil {
			return err
		}
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
	if err := d.remove(vms, cid); err != nil {
		return fmt.Errorf("removing vm %s: %w", cid, err)
	}
	d.log.Info("local", "vm %s deleted", cid)
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
	if err := checkCID("vm", cid); err != nil {
		return err
	}
	unlock, err := d.lock(ctx, vms, cid)
	if err != nil {
		return err
	}
	defer unlock()
	rec, err := d.loadVM(cid)
	if err != nil {
		return err
	}
	dir := d.path(vms, cid)
	container := rec.Isolation == IsolationContainer
	if container && start && !d.containers() {
		return fmt.Errorf("vm %s was made in container mode: starting it needs local.isolation \"container\" (deleting it does not)", cid)
	}
	stop := func() error { return stopVM(ctx, cid, readPGID(dir), d.grace()) }
	if container {
		stop = func() error { return d.stopContainer(ctx, cid) }
	}
	if err := stop(); err != nil {
		return err
	}
	rec.Stopped = !start
	if err := d.save(vms, cid, rec); err != nil {
		return err
	}
	if start && container {
		props, err := decodeVMProps(rec.CloudProps)
		if err != nil {
			return err
		}
		if err := d.mountVM(*rec); err != nil {
			return err
		}
		if err := d.ensureBridge(ctx); err != nil {
			return err
		}
		ram, _ := d.limits(props)
		if err := d.startContainer(ctx, *rec, d.netPlan(d.ctr(cid), rec.Networks), ram); err != nil {
			return err
		}
		d.log.Info("local", "vm %s restarted", cid)
		return nil
	}
	if start && len(rec.Command) > 0 {
		props, err := decodeVMProps(rec.CloudProps)
		if err != nil {
			return err
		}
		env := d.processEnv(*rec, props)
		if err := startProcess(dir, rec.Command, env); err != nil {
			return err
		}
		d.log.Info("local", "vm %s restarted", cid)
	}
	return nil
}

// SetVMMetadata implements driver.Driver.
func (d *Driver) SetVMMetadata(ctx context.Context, cid string, md map[string]string) error {
	if err := checkCID("vm", cid); err != nil {
		return err
	}
	unlock, err := d.lock(ctx, vms, cid)
	if err != nil {
		return err
	}
	defer unlock()
	rec, err := d.loadVM(cid)
	if err != nil {
		return err
	}
	if rec.Metadata == nil {
		rec.Metadata = map[string]string{}
	}
	for k, v := range md {
		rec.Metadata[k] = v
	}
	return d.save(vms, cid, rec)
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
