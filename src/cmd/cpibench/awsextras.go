package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	elbv2 "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2"
	elbv2types "github.com/aws/aws-sdk-go-v2/service/elasticloadbalancingv2/types"
)

// withTargetGroup makes an ELBv2 target group on the test server and
// gives every VM of the suite lb_target_groups and an encrypted
// ephemeral disk, so the timings include both.
func withTargetGroup(s *cloudSuite) (func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg := aws.Config{Region: "us-east-1", Credentials: credentials.NewStaticCredentialsProvider("bench", "bench-secret", "")}
	c := ec2.NewFromConfig(cfg, func(o *ec2.Options) { o.BaseEndpoint = aws.String(s.target) })
	lb := elbv2.NewFromConfig(cfg, func(o *elbv2.Options) { o.BaseEndpoint = aws.String(s.target) })
	vpcs, err := c.DescribeVpcs(ctx, &ec2.DescribeVpcsInput{})
	if err != nil || len(vpcs.Vpcs) == 0 {
		return nil, fmt.Errorf("no VPC on %s: %v", s.target, err)
	}
	name := fmt.Sprintf("cpibench-%d", os.Getpid())
	tg, err := lb.CreateTargetGroup(ctx, &elbv2.CreateTargetGroupInput{Name: aws.String(name), Protocol: elbv2types.ProtocolEnumHttp,
		Port: aws.Int32(8080), VpcId: vpcs.Vpcs[0].VpcId})
	if err != nil {
		return nil, fmt.Errorf("creating a target group: %w", err)
	}
	props := map[string]any{"lb_target_groups": []string{name}, "ephemeral_disk": map[string]any{"size": 10240, "encrypted": true}}
	for k, v := range s.vmProps {
		props[k] = v
	}
	s.vmProps = props
	return func() {
		lb.DeleteTargetGroup(context.Background(), &elbv2.DeleteTargetGroupInput{TargetGroupArn: tg.TargetGroups[0].TargetGroupArn})
	}, nil
}
