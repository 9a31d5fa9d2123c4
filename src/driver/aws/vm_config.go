package aws

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	elb "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancing"
	elbtypes "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancing/types"
	elbv2 "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2"
	elbv2types "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2/types"

	"github.com/runway-cpi/runway/src/driver"
)

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

// placeGroups sets the instance's security groups (on every described
// interface, else on the launch). Names are resolved to ids within the
// VPC of the first interface's subnet, as the official CPI maps them (a
// name alone is ambiguous across VPCs); without a subnet they go by name
// (the default VPC's).
func (d *Driver) placeGroups(ctx context.Context, groups []string, in *ec2.RunInstancesInput) error {
	var ids, names []string
	for _, g := range groups {
		if strings.HasPrefix(g, "sg-") {
			ids = append(ids, g)
		} else {
			names = append(names, g)
		}
	}
	subnet := aws.ToString(in.SubnetId)
	if len(in.NetworkInterfaces) > 0 {
		subnet = aws.ToString(in.NetworkInterfaces[0].SubnetId)
	}
	if len(names) > 0 && subnet != "" {
		resolved, err := d.groupIDs(ctx, names, subnet)
		if err != nil {
			return err
		}
		ids, names = append(ids, resolved...), nil
	}
	if len(in.NetworkInterfaces) == 0 {
		in.SecurityGroupIds, in.SecurityGroups = ids, names
		return nil
	}
	if len(names) > 0 {
		return driver.Invalid("security group names %v need a subnet to be resolved in (several interfaces take ids)", names)
	}
	for i := range in.NetworkInterfaces {
		in.NetworkInterfaces[i].Groups = ids
	}
	return nil
}

// groupIDs resolves security group names within the subnet's VPC.
func (d *Driver) groupIDs(ctx context.Context, names []string, subnet string) ([]string, error) {
	subnets, err := call(ctx, d, "DescribeSubnets", func(ctx context.Context, c *ec2.Client) (*ec2.DescribeSubnetsOutput, error) {
		return c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: []string{subnet}})
	})
	if err != nil {
		return nil, d.cloudErr("DescribeSubnets "+subnet, err)
	}
	if len(subnets.Subnets) == 0 {
		return nil, driver.Invalid("subnet %s not found", subnet)
	}
	vpc := aws.ToString(subnets.Subnets[0].VpcId)
	found, err := call(ctx, d, "DescribeSecurityGroups", func(ctx context.Context, c *ec2.Client) (*ec2.DescribeSecurityGroupsOutput, error) {
		return c.DescribeSecurityGroups(ctx, &ec2.DescribeSecurityGroupsInput{Filters: []types.Filter{
			{Name: aws.String("vpc-id"), Values: []string{vpc}}, {Name: aws.String("group-name"), Values: names}}})
	})
	if err != nil {
		return nil, d.cloudErr("DescribeSecurityGroups in "+vpc, err)
	}
	var out []string
	for _, n := range names {
		var ids []string
		for _, g := range found.SecurityGroups {
			if aws.ToString(g.GroupName) == n {
				ids = append(ids, aws.ToString(g.GroupId))
			}
		}
		switch len(ids) {
		case 0:
			return nil, driver.Invalid("security group %q not found in %s (the VPC of subnet %s)", n, vpc, subnet)
		case 1:
			out = append(out, ids[0])
		default:
			return nil, driver.Invalid("security group name %q matches %s in %s", n, strings.Join(ids, ", "), vpc)
		}
	}
	return out, nil
}

// moveToInterface sets auto_assign_public_ip, which RunInstances takes
// only on a described interface, and only when there is one.
func moveToInterface(in *ec2.RunInstancesInput, public bool) error {
	switch {
	case len(in.NetworkInterfaces) > 1:
		return driver.Invalid("cloud_properties.auto_assign_public_ip needs a VM with one interface (EC2 refuses it with several)")
	case len(in.NetworkInterfaces) == 1:
		in.NetworkInterfaces[0].AssociatePublicIpAddress = aws.Bool(public)
		return nil
	case len(in.SecurityGroups) > 0:
		return driver.Invalid("cloud_properties.auto_assign_public_ip with security group names needs a subnet (names are resolved in its VPC)")
	}
	in.NetworkInterfaces = []types.InstanceNetworkInterfaceSpecification{{DeviceIndex: aws.Int32(0),
		AssociatePublicIpAddress: aws.Bool(public), DeleteOnTermination: aws.Bool(true),
		SubnetId: in.SubnetId, PrivateIpAddress: in.PrivateIpAddress, Groups: in.SecurityGroupIds}}
	in.SubnetId, in.PrivateIpAddress, in.SecurityGroupIds = nil, nil, nil
	return nil
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

// configureInstance does what the official CPI does once an instance
// runs: source/destination check, advertised routes, classic ELBs and
// target groups. A failure fails create_vm (the instance is terminated).
func (d *Driver) configureInstance(ctx context.Context, inst types.Instance, p vmProps) error {
	id := aws.ToString(inst.InstanceId)
	if p.SourceDestCheck != nil && !*p.SourceDestCheck {
		if _, err := call(ctx, d, "ModifyInstanceAttribute", func(ctx context.Context, c *ec2.Client) (*ec2.ModifyInstanceAttributeOutput, error) {
			return c.ModifyInstanceAttribute(ctx, &ec2.ModifyInstanceAttributeInput{InstanceId: aws.String(id),
				SourceDestCheck: &types.AttributeBooleanValue{Value: aws.Bool(false)}})
		}); err != nil {
			return d.cloudErr("ModifyInstanceAttribute "+id+" source_dest_check", err)
		}
	}
	for _, r := range p.AdvertisedRoutes {
		if err := d.advertise(ctx, id, r); err != nil {
			return err
		}
	}
	if len(p.ELBs) == 0 && len(p.LBTargetGroups) == 0 {
		return nil
	}
	lb1, lb2, err := d.lbClients(ctx)
	if err != nil {
		return err
	}
	for _, name := range p.ELBs {
		err := d.retry.Do(ctx, "aws RegisterInstancesWithLoadBalancer", func(ctx context.Context) error {
			_, err := lb1.RegisterInstancesWithLoadBalancer(ctx, &elb.RegisterInstancesWithLoadBalancerInput{
				LoadBalancerName: aws.String(name), Instances: []elbtypes.Instance{{InstanceId: aws.String(id)}}})
			return err
		})
		if err != nil {
			return d.cloudErr("RegisterInstancesWithLoadBalancer "+name, err)
		}
		d.log.Info("aws", "%s registered with load balancer %s", id, name)
	}
	for _, name := range p.LBTargetGroups {
		var arn string
		err := d.retry.Do(ctx, "aws DescribeTargetGroups", func(ctx context.Context) error {
			out, err := lb2.DescribeTargetGroups(ctx, &elbv2.DescribeTargetGroupsInput{Names: []string{name}})
			if err == nil && len(out.TargetGroups) > 0 {
				arn = aws.ToString(out.TargetGroups[0].TargetGroupArn)
			}
			return err
		})
		if err != nil || arn == "" {
			return fmt.Errorf("lb_target_groups: target group %q: %w", name, d.cloudErr("DescribeTargetGroups", orNotFound(err)))
		}
		err = d.retry.Do(ctx, "aws RegisterTargets", func(ctx context.Context) error {
			_, err := lb2.RegisterTargets(ctx, &elbv2.RegisterTargetsInput{TargetGroupArn: aws.String(arn),
				Targets: []elbv2types.TargetDescription{{Id: aws.String(id)}}})
			return err
		})
		if err != nil {
			return d.cloudErr("RegisterTargets "+name, err)
		}
		d.log.Info("aws", "%s registered in target group %s", id, name)
	}
	return nil
}

func orNotFound(err error) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("not found")
}

// advertise routes r.Destination to the instance in table r.TableID,
// replacing a route to the same destination, as the official CPI does.
func (d *Driver) advertise(ctx context.Context, id string, r route) error {
	tables, err := call(ctx, d, "DescribeRouteTables", func(ctx context.Context, c *ec2.Client) (*ec2.DescribeRouteTablesOutput, error) {
		return c.DescribeRouteTables(ctx, &ec2.DescribeRouteTablesInput{RouteTableIds: []string{r.TableID}})
	})
	if err != nil {
		return d.cloudErr("DescribeRouteTables "+r.TableID, err)
	}
	if len(tables.RouteTables) == 0 {
		return driver.Invalid("advertised_routes: route table %s not found", r.TableID)
	}
	exists := false
	for _, rt := range tables.RouteTables[0].Routes {
		if aws.ToString(rt.DestinationCidrBlock) == r.Destination {
			exists = true
		}
	}
	op := "CreateRoute"
	if exists {
		op = "ReplaceRoute"
	}
	_, err = call(ctx, d, op, func(ctx context.Context, c *ec2.Client) (struct{}, error) {
		if exists {
			_, err := c.ReplaceRoute(ctx, &ec2.ReplaceRouteInput{RouteTableId: aws.String(r.TableID),
				DestinationCidrBlock: aws.String(r.Destination), InstanceId: aws.String(id)})
			return struct{}{}, err
		}
		_, err := c.CreateRoute(ctx, &ec2.CreateRouteInput{RouteTableId: aws.String(r.TableID),
			DestinationCidrBlock: aws.String(r.Destination), InstanceId: aws.String(id)})
		return struct{}{}, err
	})
	if err != nil {
		return d.cloudErr(op+" "+r.Destination+" in "+r.TableID, err)
	}
	d.log.Info("aws", "route %s in %s goes to %s", r.Destination, r.TableID, id)
	return nil
}

// lbClients are the classic and v2 load-balancing clients (elb_endpoint,
// else the EC2 endpoint override, else AWS's regional endpoints).
func (d *Driver) lbClients(ctx context.Context) (*elb.Client, *elbv2.Client, error) {
	if _, _, err := d.clients(ctx); err != nil {
		return nil, nil, err
	}
	d.lbOnce.Do(func() {
		ep := strings.TrimRight(firstNonEmpty(d.cfg.ELBEndpoint, d.cfg.Endpoint), "/")
		d.elb = elb.NewFromConfig(d.awsCfg, func(o *elb.Options) {
			if ep != "" {
				o.BaseEndpoint = aws.String(ep)
			}
		})
		d.elbv2 = elbv2.NewFromConfig(d.awsCfg, func(o *elbv2.Options) {
			if ep != "" {
				o.BaseEndpoint = aws.String(ep)
			}
		})
	})
	return d.elb, d.elbv2, nil
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
