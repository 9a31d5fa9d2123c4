package aws

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/runway-cpi/runway/src/testkit/cpibin"
	"github.com/runway-cpi/runway/src/testkit/realinputs"
)

// TestRealCallersInputs drives bin/cpi against the EC2 server with what
// real BOSH sends (src/testkit/realinputs, each shape from its caller's
// source): the config as bosh-deployment's aws/cpi.yml renders it through
// the official job, the Director's context, a heavy stemcell's stemcell.MF
// cloud_properties and a bosh.io light stemcell's, the cloud-config's VM
// and disk types, the Director's manual, dynamic and vip network settings
// (prefix "32", nic_group) and its create_vm env. Every call must succeed.
func TestRealCallersInputs(t *testing.T) {
	ep := emptyMoto(t)
	ctx := context.Background()
	c := adminClient(t, ep)
	if _, err := c.CreateKeyPair(ctx, &ec2.CreateKeyPairInput{KeyName: aws.String("bosh")}); err != nil {
		t.Fatal(err)
	}
	subnets, err := c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{})
	if err != nil || len(subnets.Subnets) == 0 {
		t.Fatalf("no subnet in moto's default VPC: %v", err)
	}
	sn := subnets.Subnets[0]
	eip, err := c.AllocateAddress(ctx, &ec2.AllocateAddressInput{})
	if err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	// bosh-deployment aws/cpi.yml's cloud_provider properties, through the
	// official template's shape (cloud.plugin, cloud.properties.aws).
	cpi := cpibin.Configured(t, dir, "aws", map[string]any{"cloud": map[string]any{"plugin": "aws", "properties": map[string]any{
		"aws": map[string]any{"access_key_id": "testing", "secret_access_key": "testing-secret", "default_key_name": "bosh",
			"default_security_groups": []string{"default"}, "region": region, "ec2_endpoint": ep, "max_retries": 3},
		"agent": map[string]any{"mbus": "nats://nats:nats-password@10.0.0.6:4222"}}}})
	t.Setenv("RUNWAY_STATE_DIR", filepath.Join(dir, "state"))
	cpi.Secrets = []string{"testing-secret", "nats-password", "agent-blobstore-password"}
	cpi.Context = realinputs.DirectorContext("real-inputs-director", 3, nil)

	img, _ := stemcellFixture(t)
	heavy := cpibin.String(t, cpi.OK(t, nil, "create_stemcell", img, realinputs.HeavyStemcell("aws", "raw"),
		map[string]any{"tags": map[string]string{"any": "value"}}))
	ami := heavy
	light := cpibin.String(t, cpi.OK(t, nil, "create_stemcell", "", realinputs.AWSLightStemcell(region, ami)))

	az := aws.ToString(sn.AvailabilityZone)
	ip := func(last string) string { return prefix3(aws.ToString(sn.CidrBlock)) + "." + last }
	sub := map[string]any{"subnet": aws.ToString(sn.SubnetId)}
	// (moto keeps a terminated instance's address: each VM its own.)
	for name, nets := range map[string]func(i int) map[string]any{
		"manual with nic_group and vip": func(i int) map[string]any {
			return map[string]any{"default": realinputs.ManualNetwork(ip(fmt.Sprint(21+i)), "255.255.255.0", ip("1"), sub, "1"),
				"public": realinputs.VIPNetwork(aws.ToString(eip.PublicIp), map[string]any{})}
		},
		"dynamic": func(int) map[string]any { return map[string]any{"default": realinputs.DynamicNetwork(sub)} },
		"create-env": func(i int) map[string]any {
			return map[string]any{"default": realinputs.BootstrapNetwork(ip(fmt.Sprint(31+i)), "255.255.255.0", ip("1"), sub)}
		},
	} {
		t.Run(name, func(t *testing.T) {
			for i, sc := range []string{heavy, light} {
				nets := nets(i)
				env := realinputs.DirectorEnv("agent-1")
				if name == "create-env" {
					env = realinputs.BootstrapEnv()
				}
				vm := cpibin.VMCID(t, cpi.OK(t, nil, "create_vm", "agent-1", sc, realinputs.AWSVMType("t3.micro", az), nets, []string{}, env))
				cpi.OK(t, nil, "set_vm_metadata", vm, map[string]string{"director": "real-inputs-director", "deployment": "cf",
					"instance_group": "router", "job": "router", "id": "9c3b5b0a", "name": "router/9c3b5b0a", "index": "0",
					"created_at": "2026-11-24T22:31:16Z"})
				disk := cpibin.String(t, cpi.OK(t, nil, "create_disk", 3000, realinputs.AWSDiskType(), vm))
				cpi.OK(t, nil, "attach_disk", vm, disk)
				cpi.OK(t, nil, "detach_disk", vm, disk)
				cpi.OK(t, nil, "delete_disk", disk)
				cpi.OK(t, nil, "delete_vm", vm)
			}
		})
	}
	cpi.OK(t, nil, "delete_stemcell", light)
	cpi.OK(t, nil, "delete_stemcell", heavy)
}

func prefix3(cidr string) string {
	n := 0
	for i, r := range cidr {
		if r == '.' {
			if n++; n == 3 {
				return cidr[:i]
			}
		}
	}
	return cidr
}
