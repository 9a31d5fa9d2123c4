// Package cpi is the CPI service: the method table, argument types, typed
// BOSH errors and agent settings. It drives a driver.Driver and knows no IaaS.
package cpi

import (
	"context"
	"encoding/json"
	"sort"
	"strconv"

	"github.com/google/uuid"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/rpc"
)

// APIVersion is the CPI API version Runway implements.
const APIVersion = 3

// Service answers one request against one driver.
type Service struct {
	Config *config.Config
	Driver driver.Driver
	Logger logging.Logger
}

type handler func(s *Service, ctx context.Context, req *rpc.Request) (any, error)

// methods is the method table. current_vm_id and configure_networks are
// deliberately present with the answers the Director expects.
var methods = map[string]handler{
	"info":                          (*Service).info,
	"create_stemcell":               (*Service).createStemcell,
	"delete_stemcell":               (*Service).deleteStemcell,
	"create_vm":                     (*Service).createVM,
	"delete_vm":                     (*Service).deleteVM,
	"has_vm":                        (*Service).hasVM,
	"reboot_vm":                     (*Service).rebootVM,
	"set_vm_metadata":               (*Service).setVMMetadata,
	"calculate_vm_cloud_properties": (*Service).calculateVMCloudProperties,
	"create_disk":                   (*Service).createDisk,
	"delete_disk":                   (*Service).deleteDisk,
	"has_disk":                      (*Service).hasDisk,
	"resize_disk":                   (*Service).resizeDisk,
	"update_disk":                   (*Service).updateDisk,
	"attach_disk":                   (*Service).attachDisk,
	"detach_disk":                   (*Service).detachDisk,
	"set_disk_metadata":             (*Service).setDiskMetadata,
	"get_disks":                     (*Service).getDisks,
	"snapshot_disk":                 (*Service).snapshotDisk,
	"delete_snapshot":               (*Service).deleteSnapshot,
	"current_vm_id":                 (*Service).currentVMID,
	// Runway's own, never sent by the Director: for hooks, reapers and
	// operators. Answers the VMs carrying every given tag and metadata value.
	"list_vms":           (*Service).listVMs,
	"start_vm":           (*Service).startVM,
	"stop_vm":            (*Service).stopVM,
	"configure_networks": (*Service).configureNetworks,
}

// Methods lists the implemented method names, sorted.
func Methods() []string {
	out := make([]string, 0, len(methods))
	for m := range methods {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// Known reports whether method is in the table.
func Known(method string) bool { _, ok := methods[method]; return ok }

// Call dispatches req. The error, when not nil, is always an *rpc.Error.
func (s *Service) Call(ctx context.Context, req *rpc.Request) (any, *rpc.Error) {
	h, ok := methods[req.Method]
	if !ok {
		return nil, NotImplemented("Must call implemented method: %s", req.Method)
	}
	res, err := h(s, ctx, req)
	if err != nil {
		return nil, toWire(req.Method, err)
	}
	return res, nil
}

func (s *Service) info(_ context.Context, req *rpc.Request) (any, error) {
	if err := req.Bind(); err != nil {
		return nil, err
	}
	// Always the highest version, whatever the caller sent: bosh-cli asks
	// with api_version 1 and takes a missing key for a v1 CPI.
	return map[string]any{"api_version": APIVersion, "stemcell_formats": s.Driver.StemcellFormats()}, nil
}

// createStemcell: image_path, cloud_properties[, env (v3)].
func (s *Service) createStemcell(ctx context.Context, req *rpc.Request) (any, error) {
	var path string
	var props driver.Props
	var env struct {
		Tags map[string]string `json:"tags"`
	}
	if err := req.Bind(
		rpc.Param{Name: "image_path", Into: &path},
		rpc.Param{Name: "cloud_properties", Into: &props},
		rpc.Param{Name: "env", Into: &env, Optional: true, Nullable: true},
	); err != nil {
		return nil, err
	}
	tags := s.creatorTags(req)
	for k, v := range env.Tags {
		tags[k] = v
	}
	s.Logger.Info("cpi", "creating stemcell from %s", path)
	cid, err := s.Driver.CreateStemcell(ctx, driver.StemcellSpec{ImagePath: path, CloudProps: props, Tags: tags})
	if err != nil {
		return nil, err
	}
	s.Logger.Info("cpi", "created stemcell %s", cid)
	return cid, nil
}

func (s *Service) deleteStemcell(ctx context.Context, req *rpc.Request) (any, error) {
	var cid string
	if err := req.Bind(rpc.Param{Name: "stemcell_cid", Into: &cid}); err != nil {
		return nil, err
	}
	return nil, s.Driver.DeleteStemcell(ctx, cid)
}

// createVM: agent_id, stemcell_cid, cloud_properties, networks, disk_cids, environment.
func (s *Service) createVM(ctx context.Context, req *rpc.Request) (any, error) {
	var spec driver.VMSpec
	if err := req.Bind(
		rpc.Param{Name: "agent_id", Into: &spec.AgentID},
		rpc.Param{Name: "stemcell_cid", Into: &spec.StemcellCID},
		rpc.Param{Name: "cloud_properties", Into: &spec.CloudProps},
		rpc.Param{Name: "networks", Into: &spec.Networks},
		rpc.Param{Name: "disk_cids", Into: &spec.DiskCIDs, Nullable: true},
		rpc.Param{Name: "environment", Into: &spec.Env, Nullable: true},
	); err != nil {
		return nil, err
	}
	if spec.AgentID == "" {
		return nil, CpiError("create_vm: argument 1 (agent_id) must not be empty")
	}
	if spec.Networks == nil {
		spec.Networks = driver.Networks{}
	}
	id, err := uuid.NewRandom()
	if err != nil {
		return nil, VMCreationFailed(true, "generating vm name: %v", err)
	}
	spec.Name = "vm-" + id.String()
	spec.Tags = s.creatorTags(req)
	spec.Tags["agent_id"] = spec.AgentID
	if bosh, ok := spec.Env["bosh"].(map[string]any); ok {
		if tags, ok := bosh["tags"].(map[string]any); ok {
			for k, v := range tags {
				if sv, ok := v.(string); ok {
					spec.Tags[k] = sv
				}
			}
		}
	}
	if req.StemcellAPIVersion() >= 2 {
		settings := newAgentSettings(s.Config.Agent, spec.AgentID, spec.Name, spec.Networks, spec.Env)
		b, err := json.Marshal(settings)
		if err != nil {
			return nil, CpiError("encoding agent settings: %v", err)
		}
		spec.AgentSettings = b
	}
	s.Logger.Info("cpi", "creating vm %s for agent %s from stemcell %s", spec.Name, spec.AgentID, spec.StemcellCID)
	vm, err := s.Driver.CreateVM(ctx, spec)
	if err != nil {
		return nil, err
	}
	s.Logger.Info("cpi", "created vm %s", vm.CID)
	if req.APIVersion >= 2 {
		return []any{vm.CID, vm.Networks}, nil
	}
	return vm.CID, nil
}

func (s *Service) vmCID(req *rpc.Request) (string, error) {
	var cid string
	if err := req.Bind(rpc.Param{Name: "vm_cid", Into: &cid}); err != nil {
		return "", err
	}
	return cid, nil
}

func (s *Service) deleteVM(ctx context.Context, req *rpc.Request) (any, error) {
	cid, err := s.vmCID(req)
	if err != nil {
		return nil, err
	}
	s.Logger.Info("cpi", "deleting vm %s", cid)
	return nil, s.Driver.DeleteVM(ctx, cid)
}

func (s *Service) hasVM(ctx context.Context, req *rpc.Request) (any, error) {
	cid, err := s.vmCID(req)
	if err != nil {
		return nil, err
	}
	return s.Driver.HasVM(ctx, cid)
}

func (s *Service) rebootVM(ctx context.Context, req *rpc.Request) (any, error) {
	cid, err := s.vmCID(req)
	if err != nil {
		return nil, err
	}
	s.Logger.Info("cpi", "rebooting vm %s", cid)
	return nil, s.Driver.RebootVM(ctx, cid)
}

func (s *Service) startVM(ctx context.Context, req *rpc.Request) (any, error) {
	cid, err := s.vmCID(req)
	if err != nil {
		return nil, err
	}
	s.Logger.Info("cpi", "starting vm %s", cid)
	return nil, s.Driver.StartVM(ctx, cid)
}

func (s *Service) stopVM(ctx context.Context, req *rpc.Request) (any, error) {
	cid, err := s.vmCID(req)
	if err != nil {
		return nil, err
	}
	s.Logger.Info("cpi", "stopping vm %s", cid)
	return nil, s.Driver.StopVM(ctx, cid)
}

func (s *Service) setVMMetadata(ctx context.Context, req *rpc.Request) (any, error) {
	var cid string
	var md map[string]any
	if err := req.Bind(rpc.Param{Name: "vm_cid", Into: &cid}, rpc.Param{Name: "metadata", Into: &md}); err != nil {
		return nil, err
	}
	return nil, s.Driver.SetVMMetadata(ctx, cid, stringify(md))
}

func (s *Service) calculateVMCloudProperties(ctx context.Context, req *rpc.Request) (any, error) {
	var r driver.Resources
	if err := req.Bind(rpc.Param{Name: "desired_instance_size", Into: &r}); err != nil {
		return nil, err
	}
	if r.CPU < 0 || r.RAM < 0 || r.EphemeralDiskSize < 0 {
		return nil, CpiError("calculate_vm_cloud_properties: cpu, ram and ephemeral_disk_size must not be negative")
	}
	return s.Driver.CalculateVMCloudProperties(ctx, r)
}

// createDisk: size (MiB), cloud_properties, vm_cid (nullable).
func (s *Service) createDisk(ctx context.Context, req *rpc.Request) (any, error) {
	var spec driver.DiskSpec
	var vm *string
	if err := req.Bind(
		rpc.Param{Name: "size", Into: &spec.SizeMiB},
		rpc.Param{Name: "cloud_properties", Into: &spec.CloudProps},
		rpc.Param{Name: "vm_cid", Into: &vm, Nullable: true, Optional: true},
	); err != nil {
		return nil, err
	}
	if spec.SizeMiB <= 0 {
		return nil, CpiError("create_disk: argument 1 (size) must be a positive number of MiB, got %d", spec.SizeMiB)
	}
	if vm != nil {
		spec.VMCID = *vm
	}
	spec.Tags = s.creatorTags(req)
	s.Logger.Info("cpi", "creating %d MiB disk", spec.SizeMiB)
	cid, err := s.Driver.CreateDisk(ctx, spec)
	if err != nil {
		return nil, err
	}
	s.Logger.Info("cpi", "created disk %s", cid)
	return cid, nil
}

func (s *Service) diskCID(req *rpc.Request) (string, error) {
	var cid string
	if err := req.Bind(rpc.Param{Name: "disk_cid", Into: &cid}); err != nil {
		return "", err
	}
	return cid, nil
}

func (s *Service) deleteDisk(ctx context.Context, req *rpc.Request) (any, error) {
	cid, err := s.diskCID(req)
	if err != nil {
		return nil, err
	}
	s.Logger.Info("cpi", "deleting disk %s", cid)
	return nil, s.Driver.DeleteDisk(ctx, cid)
}

func (s *Service) hasDisk(ctx context.Context, req *rpc.Request) (any, error) {
	cid, err := s.diskCID(req)
	if err != nil {
		return nil, err
	}
	return s.Driver.HasDisk(ctx, cid)
}

func (s *Service) resizeDisk(ctx context.Context, req *rpc.Request) (any, error) {
	var cid string
	var size int
	if err := req.Bind(rpc.Param{Name: "disk_cid", Into: &cid}, rpc.Param{Name: "new_size", Into: &size}); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, CpiError("resize_disk: argument 2 (new_size) must be a positive number of MiB, got %d", size)
	}
	s.Logger.Info("cpi", "resizing disk %s to %d MiB", cid, size)
	return nil, s.Driver.ResizeDisk(ctx, cid, size)
}

func (s *Service) updateDisk(ctx context.Context, req *rpc.Request) (any, error) {
	var cid string
	var size int
	var props driver.Props
	if err := req.Bind(rpc.Param{Name: "disk_cid", Into: &cid}, rpc.Param{Name: "new_size", Into: &size},
		rpc.Param{Name: "cloud_properties", Into: &props}); err != nil {
		return nil, err
	}
	if size <= 0 {
		return nil, CpiError("update_disk: argument 2 (new_size) must be a positive number of MiB, got %d", size)
	}
	s.Logger.Info("cpi", "updating disk %s to %d MiB", cid, size)
	return s.Driver.UpdateDisk(ctx, cid, size, props)
}

func (s *Service) vmAndDisk(req *rpc.Request) (string, string, error) {
	var vm, disk string
	if err := req.Bind(rpc.Param{Name: "vm_cid", Into: &vm}, rpc.Param{Name: "disk_cid", Into: &disk}); err != nil {
		return "", "", err
	}
	return vm, disk, nil
}

func (s *Service) attachDisk(ctx context.Context, req *rpc.Request) (any, error) {
	vm, disk, err := s.vmAndDisk(req)
	if err != nil {
		return nil, err
	}
	s.Logger.Info("cpi", "attaching disk %s to vm %s", disk, vm)
	hint, err := s.Driver.AttachDisk(ctx, vm, disk)
	if err != nil {
		return nil, err
	}
	if req.APIVersion >= 2 {
		if hint == nil || hint == "" {
			return nil, CloudError("attach_disk: driver returned no disk hint for %s", disk)
		}
		return hint, nil
	}
	return nil, nil
}

func (s *Service) detachDisk(ctx context.Context, req *rpc.Request) (any, error) {
	vm, disk, err := s.vmAndDisk(req)
	if err != nil {
		return nil, err
	}
	s.Logger.Info("cpi", "detaching disk %s from vm %s", disk, vm)
	return nil, s.Driver.DetachDisk(ctx, vm, disk)
}

func (s *Service) setDiskMetadata(ctx context.Context, req *rpc.Request) (any, error) {
	var cid string
	var md map[string]any
	if err := req.Bind(rpc.Param{Name: "disk_cid", Into: &cid}, rpc.Param{Name: "metadata", Into: &md}); err != nil {
		return nil, err
	}
	return nil, s.Driver.SetDiskMetadata(ctx, cid, stringify(md))
}

func (s *Service) getDisks(ctx context.Context, req *rpc.Request) (any, error) {
	cid, err := s.vmCID(req)
	if err != nil {
		return nil, err
	}
	disks, err := s.Driver.GetDisks(ctx, cid)
	if disks == nil && err == nil {
		disks = []string{}
	}
	return disks, err
}

func (s *Service) snapshotDisk(ctx context.Context, req *rpc.Request) (any, error) {
	var cid string
	var md map[string]any
	if err := req.Bind(rpc.Param{Name: "disk_cid", Into: &cid}, rpc.Param{Name: "metadata", Into: &md}); err != nil {
		return nil, err
	}
	s.Logger.Info("cpi", "snapshotting disk %s", cid)
	return s.Driver.SnapshotDisk(ctx, cid, stringify(md))
}

func (s *Service) deleteSnapshot(ctx context.Context, req *rpc.Request) (any, error) {
	var cid string
	if err := req.Bind(rpc.Param{Name: "snapshot_cid", Into: &cid}); err != nil {
		return nil, err
	}
	s.Logger.Info("cpi", "deleting snapshot %s", cid)
	return nil, s.Driver.DeleteSnapshot(ctx, cid)
}

func (s *Service) listVMs(ctx context.Context, req *rpc.Request) (any, error) {
	var tags, md map[string]string
	if err := req.Bind(rpc.Param{Name: "tags", Into: &tags, Optional: true, Nullable: true},
		rpc.Param{Name: "metadata", Into: &md, Optional: true, Nullable: true}); err != nil {
		return nil, err
	}
	vms, err := s.Driver.ListVMs(ctx, tags)
	if err != nil {
		return nil, err
	}
	out := []map[string]any{}
	for _, vm := range vms {
		ok := true
		for k, v := range md {
			ok = ok && vm.Metadata[k] == v
		}
		if ok {
			out = append(out, map[string]any{"cid": vm.CID, "agent_id": vm.AgentID, "state": vm.State,
				"tags": vm.Tags, "metadata": vm.Metadata, "networks": vm.Networks})
		}
	}
	return out, nil
}

func (s *Service) currentVMID(context.Context, *rpc.Request) (any, error) {
	return nil, NotImplemented("current_vm_id is deprecated and not implemented")
}

func (s *Service) configureNetworks(context.Context, *rpc.Request) (any, error) {
	return nil, NotSupported("configure_networks is not supported: recreate the VM to change its networks")
}

// creatorTags identify who made a resource.
func (s *Service) creatorTags(req *rpc.Request) map[string]string {
	t := map[string]string{"created_by": "runway"}
	if d := req.DirectorUUID(); d != "" {
		t["director"] = d
	}
	return t
}

// stringify turns metadata values into strings (the Director sends strings,
// but index numbers and booleans have been seen from other callers).
func stringify(md map[string]any) map[string]string {
	out := make(map[string]string, len(md))
	for k, v := range md {
		switch t := v.(type) {
		case string:
			out[k] = t
		case nil:
			out[k] = ""
		case float64:
			out[k] = strconv.FormatFloat(t, 'f', -1, 64)
		default:
			b, _ := json.Marshal(t)
			out[k] = string(b)
		}
	}
	return out
}
