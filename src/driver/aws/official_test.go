package aws

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/rpc"
	"github.com/runway-cpi/runway/src/testkit/cpibin"
)

// The official AWS CPI's cloud properties, written from its documentation
// (bosh.io/docs/aws-cpi), each with a value an operator would write.
var officialAWSVMProps = map[string]any{
	"instance_type":          "m6i.large",
	"availability_zone":      "us-east-1a",
	"key_name":               "bosh",
	"security_groups":        []string{"sg-0123456789abcdef0"},
	"iam_instance_profile":   "director",
	"elbs":                   []string{"web"},
	"lb_target_groups":       []string{"web-tg"},
	"placement_group":        "pg",
	"tenancy":                "dedicated",
	"spot_bid_price":         0.1,
	"spot_ondemand_fallback": true,
	"source_dest_check":      false,
	"advertised_routes":      []map[string]any{{"table_id": "rtb-0123456789abcdef0", "destination": "10.0.0.0/8"}},
	"auto_assign_public_ip":  true,
	"raw_instance_storage":   true,
	"root_disk":              map[string]any{"size": 30720, "type": "gp3", "iops": 3000, "throughput": 125},
	"ephemeral_disk": map[string]any{"size": 20480, "type": "gp3", "iops": 3000, "throughput": 125, "encrypted": true,
		"kms_key_arn": "arn:aws:kms:us-east-1:1:key/k"},
	"metadata_options": map[string]any{"http_tokens": "required"},
	"tags":             map[string]string{"team": "a"},
}

// refusedAWSVMProps: none; every official VM key is implemented.
var refusedAWSVMProps = map[string]string{}

var officialAWSDiskProps = map[string]any{"type": "io2", "iops": 4000, "throughput": 250, "encrypted": true,
	"kms_key_arn": "arn:aws:kms:us-east-1:1:key/k", "tags": map[string]string{"team": "a"}}

// TestEveryOfficialCloudPropertyIsHonouredOrRefusedByName: against a
// closed endpoint, a key that passes the driver's checks fails on the
// endpoint; a refused key fails before, naming itself; a misspelt key
// names the closest known one.
func TestEveryOfficialCloudPropertyIsHonouredOrRefusedByName(t *testing.T) {
	dir := t.TempDir()
	cpi := cpibin.Configured(t, dir, "aws", map[string]any{"cloud": map[string]any{"plugin": "aws", "properties": map[string]any{
		"aws": map[string]any{"access_key_id": "k", "secret_access_key": "secret-key-1", "region": "us-east-1",
			"ec2_endpoint": "http://127.0.0.1:9", "max_retries": 0}}}})
	t.Setenv("RUNWAY_STATE_DIR", filepath.Join(dir, "state"))
	cpi.Secrets = []string{"secret-key-1"}
	const reached = "127.0.0.1:9"
	const ami = "ami-0123456789abcdef0"
	nets := map[string]any{"private": map[string]any{"type": "manual", "ip": "10.0.0.5",
		"cloud_properties": map[string]any{"subnet": "subnet-0123456789abcdef0", "security_groups": []string{"sg-0123456789abcdef1"}}}}
	for key, v := range officialAWSVMProps {
		props := map[string]any{"instance_type": "m6i.large", key: v}
		if key == "spot_ondemand_fallback" {
			props["spot_bid_price"] = 0.1
		}
		cpibin.HonouredOrRefused(t, "vm", key, cpi.Call(t, nil, "create_vm", "agent", ami, props, nets, []string{}, map[string]any{}), refusedAWSVMProps[key], reached)
	}
	for key, v := range officialAWSDiskProps {
		cpibin.HonouredOrRefused(t, "disk", key, cpi.Call(t, nil, "create_disk", 1024, map[string]any{key: v}, nil), "", reached)
	}
	for key, v := range map[string]any{"ami": map[string]string{"us-east-1": ami}, "encrypted": true, "kms_key_arn": "arn:aws:kms:us-east-1:1:key/k"} {
		props := map[string]any{"ami": map[string]string{"us-east-1": ami}, key: v}
		if key == "kms_key_arn" {
			props["encrypted"] = true
		}
		cpibin.HonouredOrRefused(t, "stemcell", key, cpi.Call(t, nil, "create_stemcell", "", props), "", reached)
	}
	// Several networks on one interface (nic_group), an IPv6 address and
	// a delegated prefix, as the Director sends them.
	sub := map[string]any{"subnet": "subnet-0123456789abcdef0"}
	grouped := map[string]any{
		"v4":  map[string]any{"type": "manual", "ip": "10.0.0.5", "nic_group": "pair", "default": []string{"gateway"}, "cloud_properties": sub},
		"v6":  map[string]any{"type": "manual", "ip": "2001:db8::5", "nic_group": "pair", "cloud_properties": sub},
		"pfx": map[string]any{"type": "manual", "ip": "10.0.1.16", "prefix": 28, "nic_group": "pair", "cloud_properties": sub},
	}
	cpibin.HonouredOrRefused(t, "network", "nic_group, prefix, IPv6",
		cpi.Call(t, nil, "create_vm", "agent", ami, map[string]any{"instance_type": "t3.micro"}, grouped, []string{}, map[string]any{}), "", reached)
	grouped["pfx"].(map[string]any)["prefix"] = 24
	cpibin.HonouredOrRefused(t, "network", "prefix /24",
		cpi.Call(t, nil, "create_vm", "agent", ami, map[string]any{"instance_type": "t3.micro"}, grouped, []string{}, map[string]any{}),
		"EC2 delegates IPv4 /28 and IPv6 /80 prefixes", reached)
	cpibin.HonouredOrRefused(t, "stemcell", "kernel_id", cpi.Call(t, nil, "create_stemcell", "", map[string]any{"kernel_id": "aki-1"}), "kernel_id: paravirtual kernels", reached)
	for what, r := range map[string]rpc.Reply{
		`"lb_target_group"`: cpi.Call(t, nil, "create_vm", "agent", ami, map[string]any{"instance_type": "t3.micro", "lb_target_group": []string{"x"}}, nets, []string{}, map[string]any{}),
		`"use_root_disc"`: cpi.Call(t, nil, "create_vm", "agent", ami, map[string]any{"instance_type": "t3.micro",
			"ephemeral_disk": map[string]any{"use_root_disc": true}}, nets, []string{}, map[string]any{}),
		`"kms_key"`: cpi.Call(t, nil, "create_disk", 1024, map[string]any{"kms_key": "k"}, nil),
	} {
		if r.Error == nil || !strings.Contains(r.Error.Message, "unknown key "+what) || strings.Contains(r.Error.Message, reached) {
			t.Errorf("misspelt %s: %+v", what, r.Error)
		}
	}
}
