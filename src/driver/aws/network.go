package aws

import (
	"context"
	"fmt"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/cloudtags"
	"github.com/runway-cpi/runway/src/driver/netprefix"
)

// nicPlan is one network interface: the BOSH networks of one nic_group
// (a manual network's group is its own name unless it names one), or
// the dynamic network. Its networks share the subnet; an IPv4 and an
// IPv6 address, and a delegated IPv4 (/28) or IPv6 (/80) prefix, may
// come from different networks of the group.
type nicPlan struct {
	group            string
	names            []string
	subnet           string
	dynamic          bool
	ipv4, ipv6       string
	prefix4, prefix6 string
	defaultGateway   bool
}

// netPlan is every interface, the default-gateway one first, plus the
// vip network (an Elastic IP) if any.
type netPlan struct {
	nics []nicPlan
	vip  string
}

// planNICs groups the networks as the official CPI does (nic_group) and
// checks each group.
func planNICs(nets driver.Networks, p *vmProps) (netPlan, error) {
	var plan netPlan
	names := make([]string, 0, len(nets))
	for name := range nets {
		names = append(names, name)
	}
	sort.Strings(names)
	groups := map[string]*nicPlan{}
	var order []string
	dynamic := ""
	for _, name := range names {
		n := nets[name]
		if n.Type != "" && n.Type != "manual" {
			// The Director puts a one-address prefix ("32") on every
			// network; a delegated one is for manual networks.
			if one, err := netprefix.OneAddress(n); err != nil {
				return plan, driver.Invalid("%s: %v", describeNet(name, n), err)
			} else if !one {
				return plan, driver.Invalid("%s: prefix %s: a delegated prefix is for manual networks", describeNet(name, n), n.Prefix)
			}
		}
		switch n.Type {
		case "vip":
			if plan.vip != "" {
				return plan, driver.Invalid("%s: only one vip network per VM", describeNet(name, n))
			}
			if n.IP == "" {
				return plan, driver.Invalid("%s has no ip", describeNet(name, n))
			}
			plan.vip = name
			continue
		case "", "manual", "dynamic":
		default:
			return plan, driver.Invalid("%s: unknown network type", describeNet(name, n))
		}
		var np netProps
		if err := n.CloudProperties.Decode("networks."+name+".cloud_properties", &np); err != nil {
			return plan, err
		}
		p.SecurityGroups = append(p.SecurityGroups, np.SecurityGroups...)
		subnet := firstNonEmpty(np.Subnet, p.SubnetID)
		group := firstNonEmpty(n.NICGroup, name)
		if n.Type == "dynamic" {
			if dynamic != "" {
				return plan, driver.Invalid("networks %q and %q: one dynamic network per VM", dynamic, name)
			}
			if n.NICGroup != "" {
				return plan, driver.Invalid("%s: nic_group is for manual networks", describeNet(name, n))
			}
			dynamic = name
		}
		g := groups[group]
		if g == nil {
			g = &nicPlan{group: group, subnet: subnet, dynamic: n.Type == "dynamic"}
			groups[group] = g
			order = append(order, group)
		} else if g.dynamic || n.Type == "dynamic" {
			return plan, driver.Invalid("%s: a dynamic network cannot share nic_group %q", describeNet(name, n), group)
		}
		if g.subnet != subnet {
			return plan, driver.Invalid("networks of nic_group %q are on subnets %q and %q: one interface is in one subnet", group, g.subnet, subnet)
		}
		g.names = append(g.names, name)
		g.defaultGateway = g.defaultGateway || slices.Contains(n.Default, "gateway")
		if n.Type == "dynamic" {
			continue
		}
		if n.IP == "" {
			return plan, driver.Invalid("%s has no ip", describeNet(name, n))
		}
		if subnet == "" {
			return plan, driver.Invalid("%s needs cloud_properties.subnet for its fixed ip", describeNet(name, n))
		}
		if err := g.add(name, n); err != nil {
			return plan, err
		}
	}
	for _, name := range order {
		g := groups[name]
		if !g.dynamic && g.ipv4 == "" && g.ipv6 == "" {
			return plan, driver.Invalid("nic_group %q has only prefix networks: an interface needs an address (a prefix network is a secondary one)", name)
		}
		plan.nics = append(plan.nics, *g)
	}
	sort.SliceStable(plan.nics, func(i, j int) bool { return plan.nics[i].defaultGateway && !plan.nics[j].defaultGateway })
	return plan, nil
}

// add takes a manual network's address or delegated prefix.
func (g *nicPlan) add(name string, n driver.Network) error {
	ip := net.ParseIP(n.IP)
	if ip == nil {
		return driver.Invalid("%s: ip %q is not an address", describeNet(name, n), n.IP)
	}
	v6 := ip.To4() == nil
	bits := 32
	if v6 {
		bits = 128
	}
	if b, ok, err := netprefix.Bits(n); err != nil {
		return driver.Invalid("%s: %v", describeNet(name, n), err)
	} else if ok {
		bits = b
	}
	full := bits == 32 && !v6 || bits == 128 && v6
	switch {
	case full && !v6 && g.ipv4 == "":
		g.ipv4 = n.IP
	case full && v6 && g.ipv6 == "":
		g.ipv6 = n.IP
	case !v6 && bits == 28 && g.prefix4 == "":
		g.prefix4 = fmt.Sprintf("%s/%d", n.IP, bits)
	case v6 && bits == 80 && g.prefix6 == "":
		g.prefix6 = fmt.Sprintf("%s/%d", n.IP, bits)
	case !full:
		return driver.Invalid("%s: prefix /%d: EC2 delegates IPv4 /28 and IPv6 /80 prefixes", describeNet(name, n), bits)
	default:
		return driver.Invalid("%s: nic_group %q already has an address of that family", describeNet(name, n), g.group)
	}
	return nil
}

// simple: one interface with at most an IPv4 address, which RunInstances
// takes without describing the interface.
func (pl netPlan) simple() bool {
	return len(pl.nics) == 0 || len(pl.nics) == 1 && pl.nics[0].ipv6 == "" && pl.nics[0].prefix4 == "" && pl.nics[0].prefix6 == ""
}

// apply writes the interfaces into the launch: the plain fields for one
// simple interface, else one described interface per nic_group.
func (pl netPlan) apply(in *ec2.RunInstancesInput) {
	if pl.simple() {
		if len(pl.nics) == 1 {
			in.SubnetId = nilIfEmpty(pl.nics[0].subnet)
			in.PrivateIpAddress = nilIfEmpty(pl.nics[0].ipv4)
		}
		return
	}
	for i, g := range pl.nics {
		spec := types.InstanceNetworkInterfaceSpecification{DeviceIndex: aws.Int32(int32(i)), DeleteOnTermination: aws.Bool(true),
			SubnetId: nilIfEmpty(g.subnet), PrivateIpAddress: nilIfEmpty(g.ipv4)}
		if g.ipv6 != "" {
			spec.Ipv6Addresses = []types.InstanceIpv6Address{{Ipv6Address: aws.String(g.ipv6)}}
		}
		if g.prefix4 != "" {
			spec.Ipv4Prefixes = []types.Ipv4PrefixSpecificationRequest{{Ipv4Prefix: aws.String(g.prefix4)}}
		}
		if g.prefix6 != "" {
			spec.Ipv6Prefixes = []types.Ipv6PrefixSpecificationRequest{{Ipv6Prefix: aws.String(g.prefix6)}}
		}
		in.NetworkInterfaces = append(in.NetworkInterfaces, spec)
	}
}

// names is tagNetworks' value: where list_vms finds each network's
// address: "private"/"public" (the instance's), "eni<i>" (interface i's
// first private address), "eni<i>6" (its IPv6 address).
func (pl netPlan) names(nets driver.Networks) string {
	m := map[string]string{}
	for i, g := range pl.nics {
		for _, name := range g.names {
			n := nets[name]
			if one, _ := netprefix.OneAddress(n); !one {
				continue // a delegated prefix, not an address of the VM
			}
			switch {
			case strings.Contains(n.IP, ":"):
				m[name] = fmt.Sprintf("eni%d6", i)
			case i == 0:
				m[name] = "private"
			default:
				m[name] = fmt.Sprintf("eni%d", i)
			}
		}
	}
	if pl.vip != "" {
		m[pl.vip] = "public"
	}
	return cloudtags.EncodeNames(m, 256)
}

// address finds one network's address on a running instance (see names).
func address(i types.Instance, which string) string {
	switch which {
	case "private":
		return aws.ToString(i.PrivateIpAddress)
	case "public":
		return aws.ToString(i.PublicIpAddress)
	}
	v6 := strings.HasSuffix(which, "6")
	idx, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(which, "eni"), "6"))
	if err != nil {
		return ""
	}
	for _, ni := range i.NetworkInterfaces {
		if ni.Attachment == nil || aws.ToInt32(ni.Attachment.DeviceIndex) != int32(idx) {
			continue
		}
		if v6 {
			if len(ni.Ipv6Addresses) > 0 {
				return aws.ToString(ni.Ipv6Addresses[0].Ipv6Address)
			}
			return ""
		}
		return aws.ToString(ni.PrivateIpAddress)
	}
	return ""
}

func nilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return aws.String(s)
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
