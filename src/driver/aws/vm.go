package aws

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/cloudtags"
	"github.com/runway-cpi/runway/src/driver/found"
)

var liveStates = []string{"pending", "running", "stopping", "stopped"}

func (d *Driver) instanceIDs(ctx context.Context, match map[string]string) ([]string, error) {
	insts, err := d.instances(ctx, match)
	return idsOf(insts, func(i types.Instance) *string { return i.InstanceId }), err
}

// instances lists live instances carrying every tag in match.
func (d *Driver) instances(ctx context.Context, match map[string]string) ([]types.Instance, error) {
	filters := append(tagFilters(match), types.Filter{Name: aws.String("instance-state-name"), Values: liveStates})
	var out []types.Instance
	var next *string
	for {
		page, err := call(ctx, d, "DescribeInstances", func(ctx context.Context, c *ec2.Client) (*ec2.DescribeInstancesOutput, error) {
			return c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: filters, NextToken: next})
		})
		if err != nil {
			return out, d.cloudErr("DescribeInstances", err)
		}
		for _, r := range page.Reservations {
			out = append(out, r.Instances...)
		}
		if next = page.NextToken; aws.ToString(next) == "" {
			return out, nil
		}
	}
}

// instance describes one instance; gone (unknown or terminated) is
// ErrVMNotFound.
func (d *Driver) instance(ctx context.Context, id string) (types.Instance, error) {
	if err := validCID("vm", id); err != nil {
		return types.Instance{}, err
	}
	return describeOne(ctx, d, "DescribeInstances", "instance", id, "InvalidInstanceID.", driver.ErrVMNotFound, func(ctx context.Context, c *ec2.Client) (*ec2.DescribeInstancesOutput, error) {
		return c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	}, func(out *ec2.DescribeInstancesOutput) []types.Instance {
		var all []types.Instance
		for _, r := range out.Reservations {
			all = append(all, r.Instances...)
		}
		return all
	}, func(i types.Instance) (string, bool) {
		if !gone(i) {
			return "", false
		}
		return string(i.State.Name), true
	})
}

func gone(i types.Instance) bool {
	return i.State != nil && (i.State.Name == types.InstanceStateNameTerminated || i.State.Name == types.InstanceStateNameShuttingDown)
}

// waitInstance polls until the instance reaches state. fresh: it was just
// launched, so "not found yet" is EC2's eventual consistency, not absence.
func (d *Driver) waitInstance(ctx context.Context, id string, state types.InstanceStateName, fresh bool) (types.Instance, error) {
	var inst types.Instance
	err := d.waitFor(ctx, id+" "+string(state), func(ctx context.Context) (bool, error) {
		i, err := d.instance(ctx, id)
		switch {
		case errors.Is(err, driver.ErrVMNotFound) && fresh && i.State == nil:
			return false, nil
		case err != nil && state == types.InstanceStateNameTerminated && errors.Is(err, driver.ErrVMNotFound):
			return true, nil
		case err != nil:
			if errors.Is(err, driver.ErrVMNotFound) && state == types.InstanceStateNameRunning {
				return false, fmt.Errorf("%w: %s: %s", errLaunchFailed, id, stateReason(i))
			}
			return false, err
		}
		inst = i
		if state == types.InstanceStateNameRunning && i.State.Name == types.InstanceStateNameStopped && fresh {
			return false, fmt.Errorf("%w: %s: %s", errLaunchFailed, id, stateReason(i))
		}
		return i.State.Name == state, nil
	})
	return inst, err
}

func stateReason(i types.Instance) string {
	if i.StateReason != nil {
		return aws.ToString(i.StateReason.Code) + ": " + aws.ToString(i.StateReason.Message)
	}
	if i.State != nil {
		return string(i.State.Name)
	}
	return "unknown state"
}

func (d *Driver) associateVIP(ctx context.Context, id, ip string) error {
	addrs, err := call(ctx, d, "DescribeAddresses", func(ctx context.Context, c *ec2.Client) (*ec2.DescribeAddressesOutput, error) {
		return c.DescribeAddresses(ctx, &ec2.DescribeAddressesInput{PublicIps: []string{ip}})
	})
	if err != nil {
		return fmt.Errorf("elastic ip %s: %w", ip, d.cloudErr("DescribeAddresses", err))
	}
	if len(addrs.Addresses) == 0 {
		return driver.Invalid("elastic ip %s is not allocated to this account", ip)
	}
	_, err = call(ctx, d, "AssociateAddress", func(ctx context.Context, c *ec2.Client) (*ec2.AssociateAddressOutput, error) {
		return c.AssociateAddress(ctx, &ec2.AssociateAddressInput{InstanceId: aws.String(id),
			AllocationId: addrs.Addresses[0].AllocationId, AllowReassociation: aws.Bool(true)})
	})
	if err != nil {
		return d.cloudErr("AssociateAddress "+ip, err)
	}
	return nil
}

// DeleteVM terminates the instance and waits until EC2 reports it gone.
// Persistent disks (attached with DeleteOnTermination false) survive.
func (d *Driver) DeleteVM(ctx context.Context, cid string) (err error) {
	defer func() {
		if err == nil || errors.Is(err, driver.ErrVMNotFound) {
			_ = d.Locks.Forget(ctx, vmLock(cid)) // its attach lock, if it ever had one
		}
	}()
	i, err := d.instance(ctx, cid)
	if err != nil && !(i.State != nil && i.State.Name == types.InstanceStateNameShuttingDown) {
		return err
	}
	if _, err := call(ctx, d, "TerminateInstances", func(ctx context.Context, c *ec2.Client) (*ec2.TerminateInstancesOutput, error) {
		return c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{cid}})
	}); err != nil {
		if strings.HasPrefix(errCode(err), "InvalidInstanceID.") {
			return fmt.Errorf("instance %s: %w", cid, driver.ErrVMNotFound)
		}
		return d.cloudErr("TerminateInstances "+cid, err)
	}
	_, err = d.waitInstance(ctx, cid, types.InstanceStateNameTerminated, false)
	return err
}

// HasVM: terminated and shutting-down instances count as gone.
func (d *Driver) HasVM(ctx context.Context, cid string) (bool, error) {
	_, err := d.instance(ctx, cid)
	return found.Answer(err, driver.ErrVMNotFound)
}

func (d *Driver) RebootVM(ctx context.Context, cid string) error {
	return d.powerAction(ctx, cid, "RebootInstances", types.InstanceStateNameRunning, func(ctx context.Context, c *ec2.Client) error {
		_, err := c.RebootInstances(ctx, &ec2.RebootInstancesInput{InstanceIds: []string{cid}})
		return err
	})
}

func (d *Driver) StopVM(ctx context.Context, cid string) error {
	return d.powerAction(ctx, cid, "StopInstances", types.InstanceStateNameStopped, func(ctx context.Context, c *ec2.Client) error {
		_, err := c.StopInstances(ctx, &ec2.StopInstancesInput{InstanceIds: []string{cid}})
		return err
	})
}

func (d *Driver) StartVM(ctx context.Context, cid string) error {
	return d.powerAction(ctx, cid, "StartInstances", types.InstanceStateNameRunning, func(ctx context.Context, c *ec2.Client) error {
		_, err := c.StartInstances(ctx, &ec2.StartInstancesInput{InstanceIds: []string{cid}})
		return err
	})
}

// powerAction checks the instance exists, runs op and waits for state.
func (d *Driver) powerAction(ctx context.Context, cid, op string, state types.InstanceStateName, fn func(context.Context, *ec2.Client) error) error {
	if _, err := d.instance(ctx, cid); err != nil {
		return err
	}
	if _, err := call(ctx, d, op, func(ctx context.Context, c *ec2.Client) (struct{}, error) { return struct{}{}, fn(ctx, c) }); err != nil {
		return d.cloudErr(op+" "+cid, err)
	}
	_, err := d.waitInstance(ctx, cid, state, false)
	return err
}

// SetVMMetadata tags the instance; Name comes from the metadata the way
// the Director's other CPIs name VMs (name, else job/index).
func (d *Driver) SetVMMetadata(ctx context.Context, cid string, md map[string]string) error {
	if err := validCID("vm", cid); err != nil {
		return err
	}
	tags := cloudtags.Merge(md, nil)
	delete(tags, tagToken) // the driver's own tags are not the caller's to change
	delete(tags, tagNetworks)
	if n := md["name"]; n != "" {
		tags[tagName] = n
	} else if md["job"] != "" && md["index"] != "" {
		tags[tagName] = md["job"] + "/" + md["index"]
	}
	if len(tags) == 0 {
		return nil
	}
	// The instance's own volumes (root, ephemeral: deleted with it) carry
	// its tags too; persistent disks move between VMs and keep theirs.
	resources := []string{cid}
	if inst, err := d.instance(ctx, cid); err != nil {
		return err
	} else {
		for _, m := range inst.BlockDeviceMappings {
			if m.Ebs != nil && aws.ToBool(m.Ebs.DeleteOnTermination) && m.Ebs.VolumeId != nil {
				resources = append(resources, *m.Ebs.VolumeId)
			}
		}
	}
	_, err := call(ctx, d, "CreateTags", func(ctx context.Context, c *ec2.Client) (*ec2.CreateTagsOutput, error) {
		return c.CreateTags(ctx, &ec2.CreateTagsInput{Resources: resources, Tags: ec2Tags(tags)})
	})
	if err != nil {
		if strings.HasPrefix(errCode(err), "InvalidInstanceID.") {
			return fmt.Errorf("instance %s: %w", cid, driver.ErrVMNotFound)
		}
		return d.cloudErr("CreateTags "+cid, err)
	}
	return nil
}

// ListVMs finds live instances by tag (reapers, garm, the orchestrator).
func (d *Driver) ListVMs(ctx context.Context, match map[string]string) ([]driver.VMInfo, error) {
	insts, err := d.instances(ctx, match)
	if err != nil {
		return nil, err
	}
	out := make([]driver.VMInfo, 0, len(insts))
	for _, i := range insts {
		tags := tagMap(i.Tags)
		state := "unknown"
		switch i.State.Name {
		case types.InstanceStateNamePending, types.InstanceStateNameRunning:
			state = "running"
		case types.InstanceStateNameStopping, types.InstanceStateNameStopped:
			state = "stopped"
		}
		info := driver.VMInfo{CID: aws.ToString(i.InstanceId), AgentID: tags["agent_id"], Tags: tags, Metadata: tags, State: state}
		for name, which := range cloudtags.DecodeNames(tags[tagNetworks]) {
			if ip := address(i, which); ip != "" {
				if info.Networks == nil {
					info.Networks = driver.Networks{}
				}
				info.Networks[name] = driver.Network{IP: ip}
			}
		}
		out = append(out, info)
	}
	return out, nil
}

// deviceNames are the names EC2 recommends for EBS data volumes.
var deviceNames = func() []string {
	var out []string
	for c := 'f'; c <= 'z'; c++ {
		out = append(out, "/dev/sd"+string(c))
	}
	return out
}()

func vmLock(cid string) string { return "aws-vm-" + cid }

// AttachDisk attaches under the VM's lock, so concurrent attaches to one
// VM never pick the same device, and answers the device name as the hint.
func (d *Driver) AttachDisk(ctx context.Context, vmCID, diskCID string) (_ any, err error) {
	if err := validCID("vm", vmCID); err != nil {
		return nil, err
	}
	if err := validCID("disk", diskCID); err != nil {
		return nil, err
	}
	unlock, err := d.Locks.Lock(ctx, vmLock(vmCID))
	if err != nil {
		return nil, err
	}
	defer func() { d.Locks.Release(vmLock(vmCID), unlock, errors.Is(err, driver.ErrVMNotFound)) }()
	inst, err := d.instance(ctx, vmCID)
	if err != nil {
		return nil, err
	}
	v, err := d.volume(ctx, diskCID)
	if err != nil {
		return nil, err
	}
	if a := attachmentTo(v, vmCID); a != nil {
		if err := d.waitAttached(ctx, vmCID, diskCID); err != nil {
			return nil, err
		}
		return d.deviceHint(ctx, inst, diskCID, aws.ToString(a.Device)), nil
	}
	for _, a := range v.Attachments {
		if a.State != types.VolumeAttachmentStateDetached {
			return nil, fmt.Errorf("volume %s is attached to %s, not %s", diskCID, aws.ToString(a.InstanceId), vmCID)
		}
	}
	if az := aws.ToString(v.AvailabilityZone); inst.Placement != nil && az != aws.ToString(inst.Placement.AvailabilityZone) {
		return nil, fmt.Errorf("volume %s is in %s but instance %s is in %s", diskCID, az, vmCID, aws.ToString(inst.Placement.AvailabilityZone))
	}
	used := map[string]bool{}
	for _, m := range inst.BlockDeviceMappings {
		used[strings.Replace(aws.ToString(m.DeviceName), "/dev/xvd", "/dev/sd", 1)] = true
	}
	device := ""
	for _, n := range deviceNames {
		if !used[n] {
			device = n
			break
		}
	}
	if device == "" {
		return nil, fmt.Errorf("instance %s has no free device name for %s", vmCID, diskCID)
	}
	_, err = call(ctx, d, "AttachVolume", func(ctx context.Context, c *ec2.Client) (*ec2.AttachVolumeOutput, error) {
		return c.AttachVolume(ctx, &ec2.AttachVolumeInput{Device: aws.String(device), InstanceId: aws.String(vmCID), VolumeId: aws.String(diskCID)})
	})
	if err != nil {
		// A retried attach may have happened the first time.
		if v, verr := d.volume(ctx, diskCID); verr != nil || attachmentTo(v, vmCID) == nil {
			return nil, d.cloudErr("AttachVolume "+diskCID+" to "+vmCID, err)
		}
	}
	if err := d.waitAttached(ctx, vmCID, diskCID); err != nil {
		return nil, err
	}
	d.Log.Info("attached", "volume", diskCID, "instance", vmCID, "device", device)
	return d.deviceHint(ctx, inst, diskCID, device), nil
}

// nvmeByID is where udev links an EBS volume on an NVMe-only (Nitro)
// instance, by the volume id without its dash; the device name given to
// AttachVolume is not what the kernel calls it there.
const nvmeByID = "/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_"

// deviceHint is the path the agent finds the disk at: the NVMe by-id link
// on instance types whose EBS is NVMe-only (DescribeInstanceTypes, unless
// enable_describe_instance_types is false), else the device name.
func (d *Driver) deviceHint(ctx context.Context, inst types.Instance, volume, device string) string {
	if c := d.cfg.EnableDescribeInstanceTypes; c != nil && !*c {
		return device
	}
	out, err := call(ctx, d, "DescribeInstanceTypes", func(ctx context.Context, c *ec2.Client) (*ec2.DescribeInstanceTypesOutput, error) {
		return c.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{inst.InstanceType}})
	})
	if err != nil {
		// The hint is a hint: the agent also searches; say what happened.
		d.Log.Warn("DescribeInstanceTypes failed (for the NVMe device hint)", "type", inst.InstanceType, "err", err)
		return device
	}
	if len(out.InstanceTypes) > 0 && out.InstanceTypes[0].EbsInfo != nil && out.InstanceTypes[0].EbsInfo.NvmeSupport == types.EbsNvmeSupportRequired {
		return nvmeByID + strings.Replace(volume, "-", "", 1)
	}
	return device
}

func (d *Driver) waitAttached(ctx context.Context, vmCID, diskCID string) error {
	return d.waitVolume(ctx, diskCID, func(v types.Volume) (bool, error) {
		a := attachmentTo(v, vmCID)
		if a == nil {
			return false, fmt.Errorf("volume %s is no longer attaching to %s", diskCID, vmCID)
		}
		return a.State == types.VolumeAttachmentStateAttached, nil
	})
}

// DetachDisk always names the instance (EC2 needs it to be exact; moto
// fails without it) and waits until the volume is free.
func (d *Driver) DetachDisk(ctx context.Context, vmCID, diskCID string) (err error) {
	if err := validCID("vm", vmCID); err != nil {
		return err
	}
	if err := validCID("disk", diskCID); err != nil {
		return err
	}
	unlock, err := d.Locks.Lock(ctx, vmLock(vmCID))
	if err != nil {
		return err
	}
	defer func() { d.Locks.Release(vmLock(vmCID), unlock, errors.Is(err, driver.ErrVMNotFound)) }()
	if _, err := d.instance(ctx, vmCID); err != nil {
		return err
	}
	v, err := d.volume(ctx, diskCID)
	if err != nil {
		return err
	}
	a := attachmentTo(v, vmCID)
	if a == nil {
		return fmt.Errorf("volume %s is not attached to %s: %w", diskCID, vmCID, driver.ErrDiskNotAttached)
	}
	if a.State != types.VolumeAttachmentStateDetaching {
		_, err = call(ctx, d, "DetachVolume", func(ctx context.Context, c *ec2.Client) (*ec2.DetachVolumeOutput, error) {
			return c.DetachVolume(ctx, &ec2.DetachVolumeInput{VolumeId: aws.String(diskCID), InstanceId: aws.String(vmCID), Device: a.Device})
		})
		if err != nil {
			// A retried detach may have happened the first time.
			v, verr := d.volume(ctx, diskCID)
			if a := attachmentTo(v, vmCID); verr != nil || a != nil && a.State != types.VolumeAttachmentStateDetaching {
				return d.cloudErr("DetachVolume "+diskCID+" from "+vmCID, err)
			}
		}
	}
	if err := d.waitVolume(ctx, diskCID, func(v types.Volume) (bool, error) { return attachmentTo(v, vmCID) == nil, nil }); err != nil {
		return err
	}
	d.Log.Info("detached", "volume", diskCID, "instance", vmCID)
	return nil
}

// GetDisks lists the persistent disks: attached volumes that are neither
// the root device nor deleted with the instance (ephemeral).
func (d *Driver) GetDisks(ctx context.Context, vmCID string) ([]string, error) {
	inst, err := d.instance(ctx, vmCID)
	if err != nil {
		return nil, err
	}
	out := []string{}
	for _, m := range inst.BlockDeviceMappings {
		if m.Ebs == nil || aws.ToString(m.DeviceName) == aws.ToString(inst.RootDeviceName) || aws.ToBool(m.Ebs.DeleteOnTermination) {
			continue
		}
		out = append(out, aws.ToString(m.Ebs.VolumeId))
	}
	return out, nil
}

func attachmentTo(v types.Volume, instance string) *types.VolumeAttachment {
	for i, a := range v.Attachments {
		if aws.ToString(a.InstanceId) == instance && a.State != types.VolumeAttachmentStateDetached {
			return &v.Attachments[i]
		}
	}
	return nil
}
