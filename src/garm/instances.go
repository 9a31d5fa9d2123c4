package garm

import (
	"context"
	"errors"
	"fmt"

	"github.com/cloudbase/garm-provider-common/params"

	"github.com/runway-cpi/runway/src/cpi"
	"github.com/runway-cpi/runway/src/rpc"
)

// listVMs answers list_vms for tags.
func (p *provider) listVMs(ctx context.Context, tags map[string]string) ([]cpi.ListedVM, *rpc.Error) {
	res, werr := p.call(ctx, "list_vms", tags)
	vms, _ := res.([]cpi.ListedVM)
	return vms, werr
}

// find lists this controller's VMs whose cid or instance name is id.
func (p *provider) find(ctx context.Context, id string) ([]cpi.ListedVM, error) {
	vms, werr := p.listVMs(ctx, map[string]string{TagController: p.env.ControllerID})
	if werr != nil {
		return nil, werr
	}
	var out []cpi.ListedVM
	for _, vm := range vms {
		if id != "" && (vm.CID == id || vm.Tags[TagName] == id) {
			out = append(out, vm)
		}
	}
	return out, nil
}

func instance(vm cpi.ListedVM) params.ProviderInstance {
	status := params.InstanceStatusUnknown
	switch vm.State {
	case "running":
		status = params.InstanceRunning
	case "stopped":
		status = params.InstanceStopped
	case "error":
		status = params.InstanceError
	}
	inst := params.ProviderInstance{ProviderID: vm.CID, Name: vm.Tags[TagName], OSType: params.OSType(vm.Tags[TagOSType]),
		OSArch: params.OSArch(vm.Tags[TagOSArch]), Status: status, Addresses: []params.Address{}}
	if inst.Name == "" {
		inst.Name = vm.CID
	}
	for _, n := range vm.Networks {
		if n.IP != "" {
			inst.Addresses = append(inst.Addresses, params.Address{Address: n.IP, Type: params.PrivateAddress})
		}
	}
	if status == params.InstanceError {
		inst.ProviderFault = []byte("the instance's runner process exited with an error; see its console log")
	}
	return inst
}

func (p *provider) get(ctx context.Context, id string) (params.ProviderInstance, error) {
	vms, err := p.find(ctx, id)
	if err != nil {
		return params.ProviderInstance{}, err
	}
	if len(vms) == 0 {
		return params.ProviderInstance{}, fmt.Errorf("%w: %q (controller %s)", errNotFound, id, p.env.ControllerID)
	}
	return instance(vms[0]), nil
}

func (p *provider) list(ctx context.Context) (string, error) {
	if p.env.PoolID == "" {
		return "", errors.New("GARM_POOL_ID is not set")
	}
	vms, werr := p.listVMs(ctx, map[string]string{TagController: p.env.ControllerID, TagPool: p.env.PoolID})
	if werr != nil {
		return "", werr
	}
	out := []params.ProviderInstance{}
	for _, vm := range vms {
		out = append(out, instance(vm))
	}
	return marshal(out)
}

// delete removes every VM of this controller whose cid or name is id; none
// is not an error (garm retries deletes).
func (p *provider) delete(ctx context.Context, id string) error {
	if id == "" {
		return errors.New("GARM_INSTANCE_ID is not set")
	}
	vms, err := p.find(ctx, id)
	if err != nil {
		return err
	}
	return p.deleteAll(ctx, vms)
}

func (p *provider) deleteAll(ctx context.Context, vms []cpi.ListedVM) error {
	var errs []error
	for _, vm := range vms {
		if _, werr := p.call(ctx, "delete_vm", vm.CID); werr != nil && werr.Type != rpc.TypeVMNotFound {
			errs = append(errs, fmt.Errorf("%s: %w", vm.CID, werr))
			continue
		}
		if name := vm.Tags[TagName]; name != "" {
			_ = p.sess.Locker.Forget(ctx, "garm-"+nameKey(p.env.ControllerID, name))
		}
	}
	return errors.Join(errs...)
}

func (p *provider) removeAll(ctx context.Context) error {
	vms, werr := p.listVMs(ctx, map[string]string{TagController: p.env.ControllerID})
	if werr != nil {
		return werr
	}
	p.log.Info("removing all instances of a controller", "count", len(vms), "controller", p.env.ControllerID)
	return p.deleteAll(ctx, vms)
}

func (p *provider) power(ctx context.Context, id, method string) error {
	vms, err := p.find(ctx, id)
	if err != nil {
		return err
	}
	if len(vms) == 0 {
		return fmt.Errorf("%w: %q (controller %s)", errNotFound, id, p.env.ControllerID)
	}
	if _, werr := p.call(ctx, method, vms[0].CID); werr != nil {
		return werr
	}
	return nil
}
