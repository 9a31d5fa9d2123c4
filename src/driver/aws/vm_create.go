package aws

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/google/uuid"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/cloudtags"
	"github.com/runway-cpi/runway/src/retry"
)

// retryableLaunch are RunInstances failures a later attempt can get past.
var retryableLaunch = map[string]bool{
	"InsufficientInstanceCapacity": true, "InsufficientHostCapacity": true, "InsufficientCapacity": true,
	"InsufficientFreeAddressesInSubnet": true, "InsufficientReservedInstanceCapacity": true,
	"InternalError": true, "ServiceUnavailable": true,
}

// CreateVM launches one instance and waits until it runs: planVM decides
// everything (reading, never making), applyVM launches. On any failure
// every instance carrying this call's token is terminated.
func (d *Driver) CreateVM(ctx context.Context, spec driver.VMSpec) (driver.VM, error) {
	pl, err := d.planVM(ctx, spec)
	if err != nil {
		return driver.VM{}, err
	}
	return d.applyVM(ctx, pl)
}

// vmPlan is what create_vm decided before it makes anything.
type vmPlan struct {
	spec  driver.VMSpec
	props vmProps
	ami   string
	token string // ClientToken and tag: finds what this call made
	in    *ec2.RunInstancesInput
	nics  netPlan
	vip   string // the vip network's name, if any
}

// planVM checks the request and builds the RunInstances input, reading
// (images, security groups, instance types) but making nothing.
func (d *Driver) planVM(ctx context.Context, spec driver.VMSpec) (*vmPlan, error) {
	var p vmProps
	if err := spec.CloudProps.Decode("cloud_properties", &p); err != nil {
		return nil, err
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	if err := validCID("stemcell", spec.StemcellCID); err != nil {
		return nil, err
	}
	pl := &vmPlan{spec: spec, props: p, ami: strings.Fields(spec.StemcellCID)[0], token: uuid.NewString()}
	tags := cloudtags.Merge(p.Tags, spec.Tags)
	tags[tagToken] = pl.token
	if spec.Name != "" {
		tags[tagName] = spec.Name
	}
	in := &ec2.RunInstancesInput{
		ImageId: aws.String(pl.ami), InstanceType: types.InstanceType(p.InstanceType),
		MinCount: aws.Int32(1), MaxCount: aws.Int32(1), ClientToken: aws.String(pl.token),
		TagSpecifications: []types.TagSpecification{tagSpec(types.ResourceTypeInstance, tags), tagSpec(types.ResourceTypeVolume, tags)},
	}
	pl.in = in
	d.planPlacement(in, &p)
	var err error
	if pl.nics, err = planNICs(spec.Networks, &p); err != nil {
		return nil, err
	}
	pl.nics.apply(in)
	if len(pl.nics.nics) == 0 && p.SubnetID != "" {
		in.SubnetId = aws.String(p.SubnetID)
	}
	pl.vip = pl.nics.vip
	if names := pl.nics.names(spec.Networks); names != "" {
		// The instance's only: its volumes were tagged above.
		in.TagSpecifications[0] = tagSpec(types.ResourceTypeInstance, cloudtags.Merge(tags, map[string]string{tagNetworks: names}))
	}
	groups := p.SecurityGroups
	if len(groups) == 0 {
		groups = d.cfg.DefaultSecurityGroups
	}
	if err := d.placeGroups(ctx, groups, in); err != nil {
		return nil, err
	}
	if p.AutoAssignPublicIP != nil {
		if err := moveToInterface(in, *p.AutoAssignPublicIP); err != nil {
			return nil, err
		}
	}
	if err := d.blockDevices(ctx, pl.ami, p, in); err != nil {
		return nil, err
	}
	if err := d.planUserData(ctx, pl); err != nil {
		return nil, err
	}
	if p.SpotBidPrice != nil {
		in.InstanceMarketOptions = &types.InstanceMarketOptionsRequest{MarketType: types.MarketTypeSpot,
			SpotOptions: &types.SpotMarketOptions{MaxPrice: aws.String(strconv.FormatFloat(*p.SpotBidPrice, 'f', -1, 64)),
				SpotInstanceType: types.SpotInstanceTypeOneTime, InstanceInterruptionBehavior: types.InstanceInterruptionBehaviorTerminate}}
	}
	return pl, nil
}

// planPlacement sets where the instance runs and what it is allowed:
// placement, instance metadata options, key pair, IAM profile.
func (d *Driver) planPlacement(in *ec2.RunInstancesInput, p *vmProps) {
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
}

// planUserData is the instance's user data: the cloud property, else the
// environment's user_data (garm, the orchestrator), else the agent's
// settings (raw instance storage added as its ephemeral disks).
func (d *Driver) planUserData(ctx context.Context, pl *vmPlan) error {
	p := pl.props
	var raw []string
	if p.RawInstanceStorage && (p.EphemeralDisk == nil || !p.EphemeralDisk.UseRootDisk) {
		var err error
		if raw, err = d.rawInstanceStorage(ctx, p.InstanceType, pl.in); err != nil {
			return err
		}
	}
	userData := p.UserData
	if userData == "" {
		if s, ok := pl.spec.Env["user_data"].(string); ok {
			userData = s
		} else {
			userData = string(withoutEphemeral(pl.spec.AgentSettings, p.EphemeralDisk != nil && p.EphemeralDisk.UseRootDisk))
			if len(raw) > 0 {
				userData = string(withRawEphemeral([]byte(userData), raw))
			}
		}
	}
	if userData == "" {
		return nil
	}
	if len(userData) > 16384 {
		return driver.Invalid("user data is %d bytes; EC2 allows 16384", len(userData))
	}
	pl.in.UserData = aws.String(base64.StdEncoding.EncodeToString([]byte(userData)))
	return nil
}

// applyVM launches the planned instance (on demand again if spot fails
// and the fallback is on), waits until it runs, then associates its vip
// and configures it; any failure terminates what this call made.
func (d *Driver) applyVM(ctx context.Context, pl *vmPlan) (driver.VM, error) {
	p, in := pl.props, pl.in
	launch := func(in *ec2.RunInstancesInput) (*ec2.RunInstancesOutput, int, error) {
		return create(ctx, d, "RunInstances", func(ctx context.Context, c *ec2.Client) (*ec2.RunInstancesOutput, error) {
			return c.RunInstances(ctx, in)
		}, func(ctx context.Context, c *ec2.Client) (*ec2.RunInstancesOutput, bool, error) {
			insts, err := d.instances(ctx, map[string]string{tagToken: pl.token})
			return &ec2.RunInstancesOutput{Instances: insts}, len(insts) > 0, err
		})
	}
	out, sent, err := launch(in)
	if err != nil && p.SpotBidPrice != nil && p.SpotOnDemandFallback && !errors.Is(err, driver.ErrInvalidInput) {
		// The official CPI's spot_ondemand_fallback: no spot capacity at
		// this price, so an on-demand instance instead.
		d.Log.Warn("spot request failed; launching on demand", "bid", *p.SpotBidPrice, "err", err)
		d.sweepInstances(ctx, pl.token, "")
		in.InstanceMarketOptions = nil
		out, sent, err = launch(in)
	}
	if err != nil || len(out.Instances) == 0 {
		if sent > 1 {
			d.sweepInstances(ctx, pl.token, "")
		}
		if err == nil {
			err = errors.New("RunInstances returned no instance")
		}
		return driver.VM{}, d.creationError("RunInstances", err)
	}
	id := aws.ToString(out.Instances[0].InstanceId)
	d.Log.Info("launched", "instance", id, "type", p.InstanceType, "ami", pl.ami, "agent", pl.spec.AgentID)
	if sent > 1 {
		// Sent more than once: EC2 honours the ClientToken, emulators
		// may not. Either way at most one instance survives.
		d.sweepInstances(ctx, pl.token, id)
	}
	inst, err := d.waitInstance(ctx, id, "running", true)
	if err == nil && pl.vip != "" {
		err = d.associateVIP(ctx, id, pl.spec.Networks[pl.vip].IP)
	}
	if err == nil {
		err = d.configureInstance(ctx, inst, p)
	}
	if err != nil {
		d.sweepInstances(context.WithoutCancel(ctx), pl.token, "")
		return driver.VM{}, d.creationError("waiting for "+id, err)
	}
	nets := make(driver.Networks, len(pl.spec.Networks))
	for name, n := range pl.spec.Networks {
		nets[name] = n
	}
	// A dynamic network's address is the one its interface got.
	for name, which := range cloudtags.DecodeNames(pl.nics.names(pl.spec.Networks)) {
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
		d.Log.Warn("listing for cleanup failed", "op", "DescribeInstances", "token", token, "err", err)
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
	d.Log.Info("terminating what this create left", "instances", kill)
	if _, err := call(ctx, d, "TerminateInstances", func(ctx context.Context, c *ec2.Client) (*ec2.TerminateInstancesOutput, error) {
		return c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: kill})
	}); err != nil {
		d.Log.Warn("terminating failed", "instances", kill, "err", err)
	}
}

// mergeMetadataOptions: the VM's metadata_options over the job's, key by key.
func mergeMetadataOptions(job, vm *MetadataOptions) *MetadataOptions {
	if job == nil && vm == nil {
		return nil
	}
	out := MetadataOptions{}
	for _, m := range []*MetadataOptions{job, vm} {
		if m == nil {
			continue
		}
		out.HTTPEndpoint = firstNonEmpty(m.HTTPEndpoint, out.HTTPEndpoint)
		out.HTTPTokens = firstNonEmpty(m.HTTPTokens, out.HTTPTokens)
		out.HTTPProtocolIPv6 = firstNonEmpty(m.HTTPProtocolIPv6, out.HTTPProtocolIPv6)
		out.InstanceMetadataTags = firstNonEmpty(m.InstanceMetadataTags, out.InstanceMetadataTags)
		if m.HTTPPutResponseHopLimit > 0 {
			out.HTTPPutResponseHopLimit = m.HTTPPutResponseHopLimit
		}
	}
	return &out
}

// withoutEphemeral tells the agent there is no ephemeral disk
// (ephemeral_disk.use_root_disk).
func withoutEphemeral(settings []byte, rootOnly bool) []byte {
	if !rootOnly {
		return settings
	}
	var s map[string]any
	if json.Unmarshal(settings, &s) != nil {
		return settings
	}
	if disks, ok := s["disks"].(map[string]any); ok {
		disks["ephemeral"] = nil
	}
	b, err := json.Marshal(s)
	if err != nil {
		return settings
	}
	return b
}

// rawInstanceStorage maps every instance-store volume of the type, as
// the official CPI's raw_instance_storage does, and answers the paths
// the agent finds them at: /dev/nvme<i>n1 where instance storage is NVMe
// (no mapping needed: the type attaches them), else /dev/xvdb<a+i>
// mapped from ephemeral<i>.
func (d *Driver) rawInstanceStorage(ctx context.Context, instanceType string, in *ec2.RunInstancesInput) ([]string, error) {
	out, err := call(ctx, d, "DescribeInstanceTypes", func(ctx context.Context, c *ec2.Client) (*ec2.DescribeInstanceTypesOutput, error) {
		return c.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{types.InstanceType(instanceType)}})
	})
	if err != nil {
		return nil, d.cloudErr("DescribeInstanceTypes "+instanceType, err)
	}
	var info *types.InstanceStorageInfo
	if len(out.InstanceTypes) > 0 {
		info = out.InstanceTypes[0].InstanceStorageInfo
	}
	count := 0
	if info != nil {
		for _, disk := range info.Disks {
			count += int(aws.ToInt32(disk.Count))
		}
	}
	if count == 0 {
		return nil, driver.Invalid("cloud_properties.raw_instance_storage: instance type %s has no instance storage", instanceType)
	}
	nvme := info.NvmeSupport == types.EphemeralNvmeSupportRequired || info.NvmeSupport == types.EphemeralNvmeSupportSupported
	paths := make([]string, count)
	for i := range paths {
		if nvme {
			paths[i] = fmt.Sprintf("/dev/nvme%dn1", i)
			continue
		}
		paths[i] = fmt.Sprintf("/dev/xvdb%c", 'a'+i)
		in.BlockDeviceMappings = append(in.BlockDeviceMappings, types.BlockDeviceMapping{
			DeviceName: aws.String(paths[i]), VirtualName: aws.String(fmt.Sprintf("ephemeral%d", i))})
	}
	return paths, nil
}

// withRawEphemeral tells the agent where the raw instance-store disks are
// (disks.raw_ephemeral: [{path}], as the official CPI writes it).
func withRawEphemeral(settings []byte, paths []string) []byte {
	var s map[string]any
	if json.Unmarshal(settings, &s) != nil {
		return settings
	}
	disks, ok := s["disks"].(map[string]any)
	if !ok {
		disks = map[string]any{}
		s["disks"] = disks
	}
	list := make([]map[string]string, len(paths))
	for i, p := range paths {
		list[i] = map[string]string{"path": p}
	}
	disks["raw_ephemeral"] = list
	b, err := json.Marshal(s)
	if err != nil {
		return settings
	}
	return b
}
