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
)

var liveStates = []string{"pending", "running", "stopping", "stopped"}

func (d *Driver) instanceIDs(ctx context.Context, match map[string]string) ([]string, error) {
	insts, err := d.instances(ctx, match)
	var ids []string
	for _, i := range insts {
		ids = append(ids, aws.ToString(i.InstanceId))
	}
	return ids, err
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
	out, err := describe(ctx, d, "DescribeInstances", "instance", id, "InvalidInstanceID.", driver.ErrVMNotFound, func(ctx context.Context, c *ec2.Client) (*ec2.DescribeInstancesOutput, error) {
		return c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	})
	if err != nil {
		return types.Instance{}, err
	}
	for _, r := range out.Reservations {
		for _, i := range r.Instances {
			if gone(i) {
				return i, fmt.Errorf("instance %s is %s: %w", id, i.State.Name, driver.ErrVMNotFound)
			}
			return i, nil
		}
	}
	return types.Instance{}, fmt.Errorf("instance %s: %w", id, driver.ErrVMNotFound)
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
			_ = d.locks.Forget(ctx, vmLock(cid)) // its attach lock, if it ever had one
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
	if errors.Is(err, driver.ErrVMNotFound) {
		return false, nil
	}
	return err == nil, err
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
