package aws

import (
	"context"
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
		err := d.Retry.Do(ctx, "aws RegisterInstancesWithLoadBalancer", func(ctx context.Context) error {
			_, err := lb1.RegisterInstancesWithLoadBalancer(ctx, &elb.RegisterInstancesWithLoadBalancerInput{
				LoadBalancerName: aws.String(name), Instances: []elbtypes.Instance{{InstanceId: aws.String(id)}}})
			return err
		})
		if err != nil {
			return d.cloudErr("RegisterInstancesWithLoadBalancer "+name, err)
		}
		d.Log.Info("registered with a load balancer", "instance", id, "elb", name)
	}
	for _, name := range p.LBTargetGroups {
		var arn string
		err := d.Retry.Do(ctx, "aws DescribeTargetGroups", func(ctx context.Context) error {
			out, err := lb2.DescribeTargetGroups(ctx, &elbv2.DescribeTargetGroupsInput{Names: []string{name}})
			if err == nil && len(out.TargetGroups) > 0 {
				arn = aws.ToString(out.TargetGroups[0].TargetGroupArn)
			}
			return err
		})
		if err != nil || arn == "" {
			return fmt.Errorf("lb_target_groups: target group %q: %w", name, d.cloudErr("DescribeTargetGroups", orNotFound(err)))
		}
		err = d.Retry.Do(ctx, "aws RegisterTargets", func(ctx context.Context) error {
			_, err := lb2.RegisterTargets(ctx, &elbv2.RegisterTargetsInput{TargetGroupArn: aws.String(arn),
				Targets: []elbv2types.TargetDescription{{Id: aws.String(id)}}})
			return err
		})
		if err != nil {
			return d.cloudErr("RegisterTargets "+name, err)
		}
		d.Log.Info("registered in a target group", "instance", id, "target_group", name)
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
	d.Log.Info("route set", "destination", r.Destination, "route_table", r.TableID, "instance", id)
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
