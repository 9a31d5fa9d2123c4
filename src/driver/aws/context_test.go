package aws

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/runway-cpi/runway/src/testkit/cpibin"
)

// TestTwoCPIConfigContexts: one config file (us-east-1, written with the
// official job's key names) and two cpi-config entries as the Director
// sends them, the second naming another region and its own default key
// pair at the context's top level. Each VM, disk and stemcell lands in its
// context's region, the same context finds and deletes it, a context
// naming a closed endpoint fails on that endpoint, and the context's
// secret key never comes back.
func TestTwoCPIConfigContexts(t *testing.T) {
	ep := emptyMoto(t)
	const other = "eu-west-1"
	const secret = "ctx-secret-key-0453"
	dir := t.TempDir()
	cpi := cpibin.Configured(t, dir, "aws", map[string]any{"driver": "aws", "state_dir": filepath.Join(dir, "state"),
		"aws": map[string]any{"credentials_source": "static", "access_key_id": "testing", "secret_access_key": "testing-secret",
			"region": region, "ec2_endpoint": ep, "max_retries": 3}})
	clients := map[string]*ec2.Client{}
	for _, r := range []string{region, other} {
		d, _ := newTestDriver(t, ep, "", map[string]any{"region": r})
		c, _, err := d.clients(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		clients[r] = retrying(c)
	}
	if _, err := clients[other].CreateKeyPair(context.Background(), &ec2.CreateKeyPairInput{KeyName: aws.String("ctx-key")}); err != nil {
		t.Fatal(err)
	}
	cpi.Secrets = []string{secret}
	cpi.Context = map[string]any{"director_uuid": "multi-cpi-director", "request_id": "cpi-2"}
	img, props := stemcellFixture(t)
	entries := map[string]map[string]any{
		region: nil,
		// moto takes any key pair: the secret only has to stay secret.
		other: {"region": other, "default_key_name": "ctx-key", "access_key_id": "testing", "secret_access_key": secret},
	}
	for r, ctx := range entries {
		var sc string
		json.Unmarshal(cpi.OK(t, ctx, "create_stemcell", img, props.Map()), &sc)
		var pair []json.RawMessage
		json.Unmarshal(cpi.OK(t, ctx, "create_vm", "agent-"+r, sc, map[string]any{"instance_type": "t3.micro"},
			map[string]any{"default": map[string]any{"type": "dynamic"}}, []string{}, map[string]any{}), &pair)
		var vm, disk string
		json.Unmarshal(pair[0], &vm)
		json.Unmarshal(cpi.OK(t, ctx, "create_disk", 1024, map[string]any{}, vm), &disk)

		insts, err := clients[r].DescribeInstances(context.Background(), &ec2.DescribeInstancesInput{InstanceIds: []string{vm}})
		if err != nil || len(insts.Reservations) != 1 {
			t.Fatalf("%s: instance %s is not in its region: %v", r, vm, err)
		}
		inst := insts.Reservations[0].Instances[0]
		wantKey := ""
		if ctx != nil {
			wantKey = "ctx-key"
		}
		if aws.ToString(inst.KeyName) != wantKey {
			t.Errorf("%s: key pair %q; want %q (the context's default_key_name)", r, aws.ToString(inst.KeyName), wantKey)
		}
		if _, err := clients[r].DescribeVolumes(context.Background(), &ec2.DescribeVolumesInput{VolumeIds: []string{disk}}); err != nil {
			t.Errorf("%s: disk %s is not in its region: %v", r, disk, err)
		}
		otherCtx := entries[other]
		if ctx != nil {
			otherCtx = entries[region]
		}
		cpi.ContextKeepsItsOwn(t, ctx, otherCtx, "agent-"+r, vm, disk, sc)
	}
	r := cpi.Call(t, map[string]any{"ec2_endpoint": "http://127.0.0.1:9"}, "has_vm", "i-0000000000000000f")
	if r.Error == nil || !strings.Contains(r.Error.Message, "127.0.0.1:9") {
		t.Errorf("a context naming a closed endpoint: %+v", r.Error)
	}
	r = cpi.Call(t, map[string]any{"default_security_group": []string{"sg-1"}}, "has_vm", "i-0000000000000000f")
	if r.Error == nil || !strings.Contains(r.Error.Message, `unknown key "default_security_group" (did you mean "default_security_groups"?)`) {
		t.Errorf("misspelt context key: %+v", r.Error)
	}
}
