package aws

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/google/uuid"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/retry"
)

// retryableLaunch are RunInstances failures a later attempt can get past.
var retryableLaunch = map[string]bool{
	"InsufficientInstanceCapacity": true, "InsufficientHostCapacity": true, "InsufficientCapacity": true,
	"InsufficientFreeAddressesInSubnet": true, "InsufficientReservedInstanceCapacity": true,
	"InternalError": true, "ServiceUnavailable": true,
}

// CreateVM launches one instance and waits until it runs. On any failure
// every instance carrying this call's token is terminated.
func (d *Driver) CreateVM(ctx context.Context, spec driver.VMSpec) (driver.VM, error) {
	var p vmProps
	if err := spec.CloudProps.Decode("cloud_properties", &p); err != nil {
		return driver.VM{}, err
	}
	if err := p.validate(); err != nil {
		return driver.VM{}, err
	}
	if err := validCID("stemcell", spec.StemcellCID); err != nil {
		return driver.VM{}, err
	}
	ami := strings.Fields(spec.StemcellCID)[0]
	token := uuid.NewString()
	tags := driver.MergeTags(p.Tags, spec.Tags)
	tags[tagToken] = token
	if spec.Name != "" {
		tags[tagName] = spec.Name
	}
	in := &ec2.RunInstancesInput{
		ImageId: aws.String(ami), InstanceType: types.InstanceType(p.InstanceType),
		MinCount: aws.Int32(1), MaxCount: aws.Int32(1), ClientToken: aws.String(token),
		TagSpecifications: []types.TagSpecification{tagSpec(types.ResourceTypeInstance, tags), tagSpec(types.ResourceTypeVolume, tags)},
	}
	if p.AvailabilityZone != "" || p.PlacementGroup != "" || p.Tenancy == "dedicated" {
		in.Placement = &types.Placement{}
		if p.AvailabilityZone != "" {
			in.Placement.AvailabilityZone = aws.String(p.AvailabilityZone)
		}
		if p.PlacementGroup != "" {
			in.Placement.GroupName = aws.String(p.PlacementGroup)
		}
		if p.Tenancy == "dedicated" {
			in.Placement.Tenancy = types.TenancyDedicated
		}
	}
	if m := mergeMetadataOptions(d.cfg.MetadataOptions, p.MetadataOptions); m != nil {
		in.MetadataOptions = &types.InstanceMetadataOptionsRequest{
			HttpEndpoint: types.InstanceMetadataEndpointState(m.HTTPEndpoint), HttpTokens: types.HttpTokensState(m.HTTPTokens),
			HttpProtocolIpv6:     types.InstanceMetadataProtocolState(m.HTTPProtocolIPv6),
			InstanceMetadataTags: types.InstanceMetadataTagsState(m.InstanceMetadataTags)}
		if m.HTTPPutResponseHopLimit > 0 {
			in.MetadataOptions.HttpPutResponseHopLimit = aws.Int32(m.HTTPPutResponseHopLimit)
		}
	}
	if k := firstNonEmpty(p.KeyName, d.cfg.DefaultKeyName); k != "" {
		in.KeyName = aws.String(k)
	}
	if prof := firstNonEmpty(p.IAMInstanceProfile, d.cfg.DefaultIAMInstanceProfile); prof != "" {
		if strings.HasPrefix(prof, "arn:") {
			in.IamInstanceProfile = &types.IamInstanceProfileSpecification{Arn: aws.String(prof)}
		} else {
			in.IamInstanceProfile = &types.IamInstanceProfileSpecification{Name: aws.String(prof)}
		}
	}
	plan, err := planNICs(spec.Networks, &p)
	if err != nil {
		return driver.VM{}, err
	}
	plan.apply(in)
	if len(plan.nics) == 0 && p.SubnetID != "" {
		in.SubnetId = aws.String(p.SubnetID)
	}
	vip := plan.vip
	if names := plan.names(spec.Networks); names != "" {
		// The instance's only: its volumes were tagged above.
		in.TagSpecifications[0] = tagSpec(types.ResourceTypeInstance, driver.MergeTags(tags, map[string]string{tagNetworks: names}))
	}
	groups := p.SecurityGroups
	if len(groups) == 0 {
		groups = d.cfg.DefaultSecurityGroups
	}
	if err := d.placeGroups(ctx, groups, in); err != nil {
		return driver.VM{}, err
	}
	if p.AutoAssignPublicIP != nil {
		if err := moveToInterface(in, *p.AutoAssignPublicIP); err != nil {
			return driver.VM{}, err
		}
	}

	if err := d.blockDevices(ctx, ami, p, in); err != nil {
		return driver.VM{}, err
	}
	var raw []string
	if p.RawInstanceStorage && (p.EphemeralDisk == nil || !p.EphemeralDisk.UseRootDisk) {
		if raw, err = d.rawInstanceStorage(ctx, p.InstanceType, in); err != nil {
			return driver.VM{}, err
		}
	}
	userData := p.UserData
	if userData == "" {
		if s, ok := spec.Env["user_data"].(string); ok {
			userData = s
		} else {
			userData = string(withoutEphemeral(spec.AgentSettings, p.EphemeralDisk != nil && p.EphemeralDisk.UseRootDisk))
			if len(raw) > 0 {
				userData = string(withRawEphemeral([]byte(userData), raw))
			}
		}
	}
	if userData != "" {
		if len(userData) > 16384 {
			return driver.VM{}, driver.Invalid("user data is %d bytes; EC2 allows 16384", len(userData))
		}
		in.UserData = aws.String(base64.StdEncoding.EncodeToString([]byte(userData)))
	}

	launch := func(in *ec2.RunInstancesInput) (*ec2.RunInstancesOutput, int, error) {
		return create(ctx, d, "RunInstances", func(ctx context.Context, c *ec2.Client) (*ec2.RunInstancesOutput, error) {
			return c.RunInstances(ctx, in)
		}, func(ctx context.Context, c *ec2.Client) (*ec2.RunInstancesOutput, bool, error) {
			insts, err := d.instances(ctx, map[string]string{tagToken: token})
			return &ec2.RunInstancesOutput{Instances: insts}, len(insts) > 0, err
		})
	}
	if p.SpotBidPrice != nil {
		in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot,
			SpotOptions: &types.SpotMarketOptions{MaxPrice: aws.String(strconv.FormatFloat(*p.SpotBidPrice, 'f', -1, 64)),
				SpotInstanceType: types.SpotInstanceTypeOneTime, InstanceInterruptionBehavior: types.InstanceInterruptionBehaviorTerminate}}
	}
	out, sent, err := launch(in)
	if err != nil && p.SpotBidPrice != nil && p.SpotOnDemandFallback && !errors.Is(err, driver.ErrInvalidInput) {
		// The official CPI's spot_ondemand_fallback: no spot capacity at
		// this price, so an on-demand instance instead.
		d.log.Warn("aws", "spot request at %v failed, launching on demand: %v", *p.SpotBidPrice, err)
		d.sweepInstances(ctx, token, "")
		in.InstanceMarketOptions = nil
		out, sent, err = launch(in)
	}
	if err != nil || len(out.Instances) == 0 {
		if sent > 1 {
			d.sweepInstances(ctx, token, "")
		}
		if err == nil {
			err = errors.New("RunInstances returned no instance")
		}
		return driver.VM{}, d.creationError("RunInstances", err)
	}
	id := aws.ToString(out.Instances[0].InstanceId)
	d.log.Info("aws", "launched %s (%s, %s) for agent %s", id, p.InstanceType, ami, spec.AgentID)
	if sent > 1 {
		// Sent more than once: EC2 honours the ClientToken, emulators
		// may not. Either way at most one instance survives.
		d.sweepInstances(ctx, token, id)
	}
	inst, err := d.waitInstance(ctx, id, "running", true)
	if err == nil && vip != "" {
		err = d.associateVIP(ctx, id, spec.Networks[vip].IP)
	}
	if err == nil {
		err = d.configureInstance(ctx, inst, p)
	}
	if err != nil {
		d.sweepInstances(context.WithoutCancel(ctx), token, "")
		return driver.VM{}, d.creationError("waiting for "+id, err)
	}
	nets := make(driver.Networks, len(spec.Networks))
	for name, n := range spec.Networks {
		nets[name] = n
	}
	// A dynamic network's address is the one its interface got.
	for name, which := range driver.DecodeNames(plan.names(spec.Networks)) {
		if n := nets[name]; n.Type == "dynamic" {
			n.IP = address(inst, which)
			nets[name] = n
		}
	}
	return driver.VM{CID: id, Networks: nets}, nil
}

func firstNonEmpty(s ...string) string {
	for _, v := range s {
		if v != "" {
			return v
		}
	}
	return ""
}

// blockDevices sizes the root disk (which needs the AMI's root device
// name) and adds the ephemeral disk at /dev/sdb, where the agent looks.
func (d *Driver) blockDevices(ctx context.Context, ami string, p vmProps, in *ec2.RunInstancesInput) error {
	if r := p.RootDisk; r != nil && (r.SizeMiB > 0 || r.Type != "") {
		img, err := d.image(ctx, ami)
		if err != nil {
			return err
		}
		ebsDev := &types.EbsBlockDevice{DeleteOnTermination: aws.Bool(true)}
		if r.SizeMiB > 0 {
			ebsDev.VolumeSize = aws.Int32(mibToGiB(r.SizeMiB))
		}
		setVolumeType(ebsDev, r)
		d.encrypt(ebsDev)
		in.BlockDeviceMappings = append(in.BlockDeviceMappings, types.BlockDeviceMapping{
			DeviceName: img.RootDeviceName, Ebs: ebsDev})
	}
	e := p.EphemeralDisk
	if e == nil {
		e = &ephemeralProps{}
	}
	switch {
	case e.UseRootDisk:
		// No ephemeral disk: the agent uses the root disk's free space.
	case e.UseInstanceStorage:
		in.BlockDeviceMappings = append(in.BlockDeviceMappings, types.BlockDeviceMapping{
			DeviceName: aws.String("/dev/sdb"), VirtualName: aws.String("ephemeral0")})
	default:
		// The official CPI always adds one: 10 GiB gp3 unless sized.
		size := e.SizeMiB
		if size == 0 {
			size = defaultEphemeralMiB
		}
		ebsDev := &types.EbsBlockDevice{DeleteOnTermination: aws.Bool(true), VolumeSize: aws.Int32(mibToGiB(size))}
		setVolumeType(ebsDev, &diskProps{Type: e.Type, Iops: e.Iops, Throughput: e.Throughput})
		switch {
		case e.KMSKeyARN != "":
			ebsDev.Encrypted, ebsDev.KmsKeyId = aws.Bool(true), aws.String(e.KMSKeyARN)
		case e.Encrypted != nil:
			ebsDev.Encrypted = e.Encrypted
			if *e.Encrypted && d.cfg.KMSKeyARN != "" {
				ebsDev.KmsKeyId = aws.String(d.cfg.KMSKeyARN)
			}
		default:
			d.encrypt(ebsDev)
		}
		in.BlockDeviceMappings = append(in.BlockDeviceMappings, types.BlockDeviceMapping{
			DeviceName: aws.String("/dev/sdb"), Ebs: ebsDev})
	}
	return nil
}

// defaultEphemeralMiB is the official CPI's ephemeral disk when none is sized.
const defaultEphemeralMiB = 10240

// encrypt applies the config's encrypted/kms_key_arn to a new volume.
func (d *Driver) encrypt(dev *types.EbsBlockDevice) {
	if d.cfg.Encrypted {
		dev.Encrypted = aws.Bool(true)
		if d.cfg.KMSKeyARN != "" {
			dev.KmsKeyId = aws.String(d.cfg.KMSKeyARN)
		}
	}
}

func setVolumeType(dev *types.EbsBlockDevice, p *diskProps) {
	dev.VolumeType = types.VolumeType(firstNonEmpty(p.Type, "gp3"))
	if p.Iops > 0 {
		dev.Iops = aws.Int32(p.Iops)
	}
	if p.Throughput > 0 {
		dev.Throughput = aws.Int32(p.Throughput)
	}
}

func (d *Driver) creationError(op string, err error) error {
	if errors.Is(err, driver.ErrInvalidInput) || errors.Is(err, driver.ErrStemcellNotFound) {
		return &driver.CreationError{Err: err}
	}
	code := errCode(err)
	// Capacity, throttles, 5xx, resets, timeouts and instances that died
	// on the way up can all succeed on another try.
	retryable := retryableLaunch[code] || classify(err).Class != retry.Permanent || errors.Is(err, retry.ErrBudgetExhausted) ||
		errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errLaunchFailed)
	return &driver.CreationError{Err: d.cloudErr(op, err), Retryable: retryable}
}

var errLaunchFailed = errors.New("instance stopped before it ran")

// sweepInstances terminates every instance carrying token except keep.
func (d *Driver) sweepInstances(ctx context.Context, token, keep string) {
	ids, err := d.instanceIDs(ctx, map[string]string{tagToken: token})
	if err != nil {
		d.log.Warn("aws", "listing instances of token %s for cleanup: %v", token, err)
		return
	}
	var kill []string
	for _, id := range ids {
		if id != keep {
			kill = append(kill, id)
		}
	}
	if len(kill) == 0 {
		return
	}
	d.log.Info("aws", "terminating %v left by this create", kill)
	if _, err := call(ctx, d, "TerminateInstances", func(ctx context.Context, c *ec2.Client) (*ec2.TerminateInstancesOutput, error) {
		return c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: kill})
	}); err != nil {
		d.log.Warn("aws", "terminating %v: %v", kill, err)
	}
}

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
	out, err := call(ctx, d, "DescribeInstances", func(ctx context.Context, c *ec2.Client) (*ec2.DescribeInstancesOutput, error) {
		return c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	})
	if err != nil {
		if strings.HasPrefix(errCode(err), "InvalidInstanceID.") {
			return types.Instance{}, fmt.Errorf("instance %s: %w", id, driver.ErrVMNotFound)
		}
		return types.Instance{}, d.cloudErr("DescribeInstances "+id, err)
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
	tags := driver.MergeTags(md, nil)
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
		for name, which := range driver.DecodeNames(tags[tagNetworks]) {
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
