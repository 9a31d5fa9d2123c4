package aws

// These tests run against a real EC2 API server (moto, scripts/ec2-dev),
// named by RUNWAY_EC2_ENDPOINT; scripts/test always starts one.

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsretry "github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/ebs"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/drivertest"
	"github.com/runway-cpi/runway/src/retry"
	"github.com/runway-cpi/runway/src/testkit/faultproxy"
	"github.com/runway-cpi/runway/src/testkit/testenv"
	"github.com/runway-cpi/runway/src/testkit/testlog"
)

const region = "us-east-1"

func motoEndpoint(t *testing.T) string {
	t.Helper()
	return testenv.Need(t, "scripts/ec2-dev start; scripts/test sets it", "RUNWAY_EC2_ENDPOINT")[0]
}

// emptyMoto is the EC2 server's endpoint, its state cleared: each test
// starts empty.
func emptyMoto(t *testing.T) string {
	t.Helper()
	ep := motoEndpoint(t)
	resetMoto(t, ep)
	return ep
}

// freshMoto is an empty EC2 server and a driver on it.
func freshMoto(t *testing.T) (string, *Driver) {
	t.Helper()
	ep := emptyMoto(t)
	d, _ := newTestDriver(t, ep, "", nil)
	return ep, d
}

// resetMoto clears the server's state.
func resetMoto(t *testing.T, ep string) {
	t.Helper()
	resp, err := http.Post(ep+"/moto-api/reset", "", nil)
	if err != nil {
		t.Fatalf("reset moto: %v", err)
	}
	resp.Body.Close()
}

// newTestDriver builds a driver on endpoint with its own lock dir (or
// lockDir, to share locks like concurrent bin/cpi processes do).
func newTestDriver(t *testing.T, endpoint, lockDir string, extra map[string]any) (*Driver, *testlog.Buffer) {
	t.Helper()
	if lockDir == "" {
		lockDir = t.TempDir()
	}
	deps, logs := drivertest.Deps(t, lockDir)
	cfg := map[string]any{"region": region, "endpoint": endpoint, "access_key_id": "testing", "secret_access_key": "testing-secret",
		"poll_max_ms": 500, "wait_timeout_seconds": 30}
	d, err := New(drivertest.Section(cfg, extra), deps)
	if err != nil {
		t.Fatal(err)
	}
	return d, logs
}

func stemcellFixture(t *testing.T) (string, driver.Props) {
	return writeStemcellImage(t, rawImage(), true, true), driver.PropsOf(map[string]any{"name": "bosh-aws-xen-hvm-ubuntu-jammy-go_agent", "version": "1.0", "disk": 3072.0})
}

func fixture(ep string, lockDir string) drivertest.Fixture {
	return drivertest.Fixture{
		New: func(t *testing.T) driver.Driver {
			d, _ := newTestDriver(t, ep, lockDir, nil)
			return d
		},
		StemcellImage: stemcellFixture,
		VMProps:       driver.PropsOf(map[string]any{"instance_type": "t3.micro"}),
		Networks:      driver.Networks{"runners": {Type: "dynamic", Default: []string{"dns", "gateway"}}},
		DiskProps:     driver.Props{},
		UnknownVM:     "i-0000000000000000f", UnknownDisk: "vol-00000000000000000",
	}
}

func TestConformance(t *testing.T) {
	ep := emptyMoto(t)
	// Registered first, so it runs after the suite's own cleanups.
	t.Cleanup(func() { assertNoLeftovers(t, ep, map[string]string{"created_by": "drivertest"}) })
	drivertest.Run(t, fixture(ep, ""))
}

// TestConformanceThroughFaults runs the whole conformance suite with a
// quarter of all requests throttled, failed with 503 or reset (before the
// server saw them, or after it acted): no call may fail and nothing may be
// left behind.
func TestConformanceThroughFaults(t *testing.T) {
	ep := emptyMoto(t)
	p, err := faultproxy.New(ep, faultproxy.AWS)
	if err != nil {
		t.Fatal(err)
	}
	p.SetRule(faultproxy.Random(0.25, 7, faultproxy.Throttle, faultproxy.ServerError, faultproxy.ResetBefore, faultproxy.ResetAfter))
	url, stop := p.Start()
	t.Cleanup(func() { assertNoLeftovers(t, ep, map[string]string{"created_by": "drivertest"}) })
	t.Cleanup(stop)
	t.Cleanup(func() { faultSummary(t, p) })
	drivertest.Run(t, fixture(url, ""))
}

func faultSummary(t *testing.T, p *faultproxy.Proxy) {
	t.Logf("%d requests: %d throttled, %d 5xx, %d reset before, %d reset after", p.Requests(),
		p.Faults(faultproxy.Throttle), p.Faults(faultproxy.ServerError), p.Faults(faultproxy.ResetBefore), p.Faults(faultproxy.ResetAfter))
	for _, f := range []faultproxy.Fault{faultproxy.Throttle, faultproxy.ServerError, faultproxy.ResetBefore, faultproxy.ResetAfter} {
		if p.Faults(f) == 0 {
			t.Errorf("no %s fault was injected: the test proves nothing about it", f)
		}
	}
}

// adminClient talks to moto directly, as an operator would to audit.
func adminClient(t *testing.T, ep string) *ec2.Client {
	d, _ := newTestDriver(t, ep, "", nil)
	c, _, err := d.clients(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return retrying(c)
}

// retrying is c with the SDK's retryer, retrying what the driver's own
// policy retries: the tests' direct checks must not fail on a connection
// moto reset now and then (seen as "use of closed network connection"),
// which the driver itself waits out.
func retrying(c *ec2.Client) *ec2.Client {
	return ec2.New(c.Options(), func(o *ec2.Options) { o.Retryer = testRetryer() })
}

// testRetryer is the SDK's standard retryer, also retrying what the
// driver's policy retries.
func testRetryer() aws.Retryer {
	return awsretry.NewStandard(func(so *awsretry.StandardOptions) {
		so.Retryables = append(so.Retryables, awsretry.IsErrorRetryableFunc(func(err error) aws.Ternary {
			if classify(err).Class != retry.Permanent {
				return aws.TrueTernary
			}
			return aws.UnknownTernary
		}))
	})
}

// assertNoLeftovers lists every kind of resource the driver creates and
// fails on any that carries the tags and still exists.
func assertNoLeftovers(t *testing.T, ep string, match map[string]string) {
	t.Helper()
	ctx := context.Background()
	c := adminClient(t, ep)
	f := tagFilters(match)
	insts, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{Filters: append(f, types.Filter{Name: aws.String("instance-state-name"), Values: liveStates})})
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, r := range insts.Reservations {
		for _, i := range r.Instances {
			left = append(left, aws.ToString(i.InstanceId)+" ("+string(i.State.Name)+")")
		}
	}
	vols, err := c.DescribeVolumes(ctx, &ec2.DescribeVolumesInput{Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range vols.Volumes {
		left = append(left, aws.ToString(v.VolumeId)+" ("+string(v.State)+")")
	}
	snaps, err := c.DescribeSnapshots(ctx, &ec2.DescribeSnapshotsInput{OwnerIds: []string{"self"}, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snaps.Snapshots {
		left = append(left, aws.ToString(s.SnapshotId))
	}
	imgs, err := c.DescribeImages(ctx, &ec2.DescribeImagesInput{Owners: []string{"self"}, Filters: f})
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range imgs.Images {
		left = append(left, aws.ToString(i.ImageId))
	}
	if len(left) > 0 {
		t.Errorf("left behind (tagged %v): %v", match, left)
	}
}

// TestRetriedCreatesLeaveOneResource: the first RunInstances, CreateVolume
// and CreateSnapshot each reach the server and then lose their answer (the
// outcome is unknown to the driver). Before sending again the driver looks
// for what carries the call's token and adopts it: each create is sent
// once, and exactly one resource exists (moto ignores ClientToken, so a
// resend would have made a second).
func TestRetriedCreatesLeaveOneResource(t *testing.T) {
	ep := emptyMoto(t)
	p, _ := faultproxy.New(ep, faultproxy.AWS)
	seen := map[string]bool{}
	posts := map[string]int{}
	var mu sync.Mutex
	p.SetRule(func(r faultproxy.Request) faultproxy.Fault {
		q, _ := url.ParseQuery(string(r.Body))
		a := q.Get("Action")
		mu.Lock()
		defer mu.Unlock()
		posts[a]++
		if (a == "RunInstances" || a == "CreateVolume" || a == "CreateSnapshot") && !seen[a] {
			seen[a] = true
			return faultproxy.ResetAfter
		}
		return faultproxy.Pass
	})
	url, stop := p.Start()
	defer stop()
	d, logs := newTestDriver(t, url, "", nil)
	ctx := context.Background()
	ami := registerTestImage(t, d)
	tags := map[string]string{"director": "dup-test"}
	vm, err := d.CreateVM(ctx, driver.VMSpec{Name: "vm-dup", StemcellCID: ami, CloudProps: driver.PropsOf(map[string]any{"instance_type": "t3.micro"}), Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	disk, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 1024, VMCID: vm.CID, Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	snap, err := d.SnapshotDisk(ctx, disk, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !seen["RunInstances"] || !seen["CreateVolume"] || !seen["CreateSnapshot"] {
		t.Fatalf("faults not injected: %v", seen)
	}
	c := adminClient(t, ep)
	insts, _ := d.instances(ctx, tags)
	allVols, _ := c.DescribeVolumes(ctx, &ec2.DescribeVolumesInput{Filters: tagFilters(map[string]string{"director": "dup-test"})})
	var dataVols []string
	for _, v := range allVols.Volumes {
		if len(v.Attachments) == 0 {
			dataVols = append(dataVols, aws.ToString(v.VolumeId))
		}
	}
	snaps, _ := c.DescribeSnapshots(ctx, &ec2.DescribeSnapshotsInput{OwnerIds: []string{"self"}, Filters: tagFilters(tags)})
	if len(insts) != 1 || aws.ToString(insts[0].InstanceId) != vm.CID {
		t.Errorf("instances after a resent RunInstances: %d; want only %s", len(insts), vm.CID)
	}
	if !slices.Equal(dataVols, []string{disk}) {
		t.Errorf("unattached volumes after a resent CreateVolume: %v; want only %s", dataVols, disk)
	}
	if len(snaps.Snapshots) != 1 || aws.ToString(snaps.Snapshots[0].SnapshotId) != snap {
		t.Errorf("snapshots after a resent CreateSnapshot: %d; want only %s", len(snaps.Snapshots), snap)
	}
	for _, a := range []string{"RunInstances", "CreateVolume", "CreateSnapshot"} {
		if posts[a] != 1 {
			t.Errorf("%s was sent %d times; want once (the lost answer resolved by lookup)", a, posts[a])
		}
	}
	if n := strings.Count(logs.String(), "an earlier attempt made it; adopting it"); n != 3 {
		t.Errorf("%d adoptions logged, want 3:\n%s", n, logs.String())
	}
	_ = d.DeleteSnapshot(ctx, snap)
	_ = d.DeleteDisk(ctx, disk)
	_ = d.DeleteVM(ctx, vm.CID)
	_ = d.DeleteStemcell(ctx, ami)
}

func registerTestImage(t *testing.T, d *Driver) string {
	t.Helper()
	img, props := stemcellFixture(t)
	ami, err := d.CreateStemcell(context.Background(), driver.StemcellSpec{ImagePath: img, CloudProps: props, Tags: map[string]string{"created_by": "aws-test"}})
	if err != nil {
		t.Fatalf("create_stemcell: %v", err)
	}
	return ami
}

// TestHeavyStemcellContent reads the uploaded snapshot back through the
// EBS direct API: the data blocks are there, the zero block was skipped.
func TestHeavyStemcellContent(t *testing.T) {
	ep, d := freshMoto(t)
	ctx := context.Background()
	ami := registerTestImage(t, d)
	img, err := d.image(ctx, ami)
	if err != nil {
		t.Fatal(err)
	}
	snap := tagMap(img.Tags)[tagSnapshot]
	if snap == "" || tagMap(img.Tags)["created_by"] != "aws-test" {
		t.Fatalf("image tags %v: want the creator and the uploaded snapshot", img.Tags)
	}
	// moto answers ListSnapshotBlocks with indices the SDK cannot parse,
	// so read the blocks one by one.
	_, eb, _ := d.clients(ctx)
	eb = ebs.New(eb.Options(), func(o *ebs.Options) { o.Retryer = testRetryer() })
	raw := rawImage()
	for idx, want := range map[int32][]byte{0: raw[:ebsBlock], 2: raw[2*ebsBlock:]} {
		b, err := eb.GetSnapshotBlock(ctx, &ebs.GetSnapshotBlockInput{SnapshotId: aws.String(snap), BlockIndex: aws.Int32(idx), BlockToken: aws.String("x")})
		if err != nil {
			t.Fatalf("block %d: %v", idx, err)
		}
		got, _ := io.ReadAll(b.BlockData)
		b.BlockData.Close()
		padded := make([]byte, ebsBlock)
		copy(padded, want)
		if !bytes.Equal(got, padded) {
			t.Errorf("block %d differs from the image (%d bytes read)", idx, len(got))
		}
	}
	if _, err := eb.GetSnapshotBlock(ctx, &ebs.GetSnapshotBlockInput{SnapshotId: aws.String(snap), BlockIndex: aws.Int32(1), BlockToken: aws.String("x")}); err == nil {
		t.Errorf("block 1 (all zeros) was uploaded; zero blocks must be skipped")
	}
	c := adminClient(t, ep)
	ss, err := c.DescribeSnapshots(ctx, &ec2.DescribeSnapshotsInput{SnapshotIds: []string{snap}})
	if err != nil || len(ss.Snapshots) != 1 || aws.ToInt32(ss.Snapshots[0].VolumeSize) != 3 {
		t.Errorf("snapshot %s: %+v, %v; want one of 3 GiB (stemcell disk 3072 MiB)", snap, ss, err)
	}
	if err := d.DeleteStemcell(ctx, ami); err != nil {
		t.Fatal(err)
	}
	if s, err := c.DescribeSnapshots(ctx, &ec2.DescribeSnapshotsInput{SnapshotIds: []string{snap}}); err == nil && len(s.Snapshots) > 0 {
		t.Errorf("snapshot %s survived delete_stemcell", snap)
	}
	if err := d.DeleteStemcell(ctx, ami); err != nil {
		t.Errorf("delete_stemcell twice: %v", err)
	}
}

func TestLightStemcell(t *testing.T) {
	_, d := freshMoto(t)
	ctx := context.Background()
	ami := registerTestImage(t, d)
	defer d.DeleteStemcell(ctx, ami)
	cid, err := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"ami": map[string]any{region: ami}})})
	if err != nil || cid != ami+" light" {
		t.Fatalf("light stemcell = %q, %v; want %q", cid, err, ami+" light")
	}
	vm, err := d.CreateVM(ctx, driver.VMSpec{StemcellCID: cid, CloudProps: driver.PropsOf(map[string]any{"instance_type": "t3.micro"})})
	if err != nil {
		t.Fatalf("create_vm from a light stemcell: %v", err)
	}
	defer d.DeleteVM(ctx, vm.CID)
	if err := d.DeleteStemcell(ctx, cid); err != nil {
		t.Fatal(err)
	}
	if _, err := d.image(ctx, ami); err != nil {
		t.Fatalf("deleting a light stemcell deregistered its AMI: %v", err)
	}
	if _, err := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"ami": map[string]any{"eu-north-9": ami}})}); !errors.Is(err, driver.ErrInvalidInput) {
		t.Errorf("light stemcell without this region: %v; want ErrInvalidInput", err)
	}
	if _, err := d.CreateStemcell(ctx, driver.StemcellSpec{CloudProps: driver.PropsOf(map[string]any{"ami": map[string]any{region: "ami-0000000000000000f"}})}); !errors.Is(err, driver.ErrStemcellNotFound) {
		t.Errorf("light stemcell of a missing AMI: %v; want ErrStemcellNotFound", err)
	}
}

// TestCreateVMPlacement: manual network with a fixed IP in a subnet,
// launch tags on the instance and its volumes, user data, sizes.
func TestCreateVMPlacement(t *testing.T) {
	ep, d := freshMoto(t)
	ctx := context.Background()
	c := adminClient(t, ep)
	ami := registerTestImage(t, d)
	defer d.DeleteStemcell(ctx, ami)
	subnets, err := c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{})
	if err != nil || len(subnets.Subnets) == 0 {
		t.Fatalf("no subnet in moto's default VPC: %v", err)
	}
	sn := subnets.Subnets[0]
	prefix := strings.Join(strings.Split(aws.ToString(sn.CidrBlock), ".")[:3], ".")
	ip := prefix + ".77"
	spec := driver.VMSpec{Name: "vm-placed", AgentID: "agent-1", StemcellCID: ami,
		CloudProps: driver.PropsOf(map[string]any{"instance_type": "m6i.large", "ephemeral_disk": map[string]any{"size": 20480}, "root_disk": map[string]any{"size": 10240}}),
		Networks: driver.Networks{"private": {Type: "manual", IP: ip, Netmask: "255.255.255.0",
			CloudProperties: driver.PropsOf(map[string]any{"subnet": aws.ToString(sn.SubnetId)})}},
		AgentSettings: []byte(`{"agent_id":"agent-1"}`), Tags: map[string]string{"director": "placement", "agent_id": "agent-1"}}
	vm, err := d.CreateVM(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteVM(ctx, vm.CID)
	if vm.Networks["private"].IP != ip {
		t.Errorf("answered networks %+v; want ip %s", vm.Networks, ip)
	}
	inst, err := d.instance(ctx, vm.CID)
	if err != nil {
		t.Fatal(err)
	}
	if aws.ToString(inst.PrivateIpAddress) != ip || aws.ToString(inst.SubnetId) != aws.ToString(sn.SubnetId) || inst.InstanceType != "m6i.large" {
		t.Errorf("instance ip %s subnet %s type %s", aws.ToString(inst.PrivateIpAddress), aws.ToString(inst.SubnetId), inst.InstanceType)
	}
	tags := tagMap(inst.Tags)
	if tags["agent_id"] != "agent-1" || tags["Name"] != "vm-placed" || tags[tagToken] == "" {
		t.Errorf("launch tags %v", tags)
	}
	ud, err := c.DescribeInstanceAttribute(ctx, &ec2.DescribeInstanceAttributeInput{InstanceId: aws.String(vm.CID), Attribute: types.InstanceAttributeNameUserData})
	if err != nil || ud.UserData == nil || !strings.Contains(decodeB64(aws.ToString(ud.UserData.Value)), `"agent_id":"agent-1"`) {
		t.Errorf("user data does not carry the agent settings: %v", err)
	}
	var sizes []int32
	for _, m := range inst.BlockDeviceMappings {
		v, err := d.volume(ctx, aws.ToString(m.Ebs.VolumeId))
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, aws.ToInt32(v.Size))
		if tagMap(v.Tags)["agent_id"] != "agent-1" {
			t.Errorf("volume %s not tagged at launch: %v", aws.ToString(v.VolumeId), v.Tags)
		}
	}
	slices.Sort(sizes)
	if !slices.Equal(sizes, []int32{10, 20}) {
		t.Errorf("volume sizes %v GiB; want root 10 and ephemeral 20", sizes)
	}
	if disks, _ := d.GetDisks(ctx, vm.CID); len(disks) != 0 {
		t.Errorf("get_disks counts root/ephemeral volumes as persistent: %v", disks)
	}
	// Bad input is refused before anything is launched.
	for name, props := range map[string]driver.Props{
		"no instance type": {},
		"wrong type":       driver.PropsOf(map[string]any{"instance_type": 7}),
	} {
		if _, err := d.CreateVM(ctx, driver.VMSpec{StemcellCID: ami, CloudProps: props}); !errors.Is(err, driver.ErrInvalidInput) {
			t.Errorf("%s: %v; want ErrInvalidInput", name, err)
		}
	}
	_, err = d.CreateVM(ctx, driver.VMSpec{StemcellCID: ami, CloudProps: driver.PropsOf(map[string]any{"instance_type": "t3.micro"}),
		Networks: driver.Networks{"a": {Type: "dynamic"}, "b": {Type: "dynamic"}}})
	if !errors.Is(err, driver.ErrInvalidInput) {
		t.Errorf("two networks: %v; want ErrInvalidInput", err)
	}
}

func decodeB64(s string) string {
	b, _ := base64.StdEncoding.DecodeString(s)
	return string(b)
}

// TestConcurrentAttachesPickDistinctDevices: drivers sharing a lock dir
// (like concurrent bin/cpi processes) attach to one VM at once.
func TestConcurrentAttachesPickDistinctDevices(t *testing.T) {
	ep := emptyMoto(t)
	lockDir := t.TempDir()
	d, _ := newTestDriver(t, ep, lockDir, nil)
	ctx := context.Background()
	ami := registerTestImage(t, d)
	defer d.DeleteStemcell(ctx, ami)
	vm, err := d.CreateVM(ctx, driver.VMSpec{StemcellCID: ami, CloudProps: driver.PropsOf(map[string]any{"instance_type": "t3.micro"})})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteVM(ctx, vm.CID)
	const n = 5
	hints := make([]any, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		disk, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 1024, VMCID: vm.CID})
		if err != nil {
			t.Fatal(err)
		}
		defer d.DeleteDisk(ctx, disk)
		wg.Add(1)
		go func() {
			defer wg.Done()
			di, _ := newTestDriver(t, ep, lockDir, nil)
			hints[i], errs[i] = di.AttachDisk(ctx, vm.CID, disk)
		}()
	}
	wg.Wait()
	seen := map[any]bool{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("attach %d: %v", i, errs[i])
		}
		if seen[hints[i]] {
			t.Fatalf("device %v handed out twice: %v", hints[i], hints)
		}
		seen[hints[i]] = true
	}
	disks, _ := d.GetDisks(ctx, vm.CID)
	if len(disks) != n {
		t.Fatalf("get_disks = %v; want %d disks", disks, n)
	}
	for _, disk := range disks {
		if err := d.DetachDisk(ctx, vm.CID, disk); err != nil {
			t.Fatal(err)
		}
	}
}

// TestThrottleOutlastingTheBudget: a cloud that throttles every request
// yields a clear "throttled" error, after logged waits — never an unknown
// error — within the wait budget: the CPI's policy is the only retry
// layer, so each attempt is one request and each is logged.
func TestThrottleOutlastingTheBudget(t *testing.T) {
	ep := motoEndpoint(t)
	p, _ := faultproxy.New(ep, faultproxy.AWS)
	p.SetRule(func(faultproxy.Request) faultproxy.Fault { return faultproxy.Throttle })
	url, stop := p.Start()
	defer stop()
	d, logs := newTestDriver(t, url, "", map[string]any{"max_attempts": 2})
	d.Retry.Budget = 2 * time.Second
	start := time.Now()
	_, err := d.HasVM(context.Background(), "i-0123456789abcdef0")
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "throttled by AWS (RequestLimitExceeded)") || !errors.Is(err, retry.ErrBudgetExhausted) {
		t.Fatalf("error %v; want a throttling error that exhausted the budget", err)
	}
	// Throttles are not bounded by max_attempts, only by the budget.
	waits := strings.Count(logs.String(), `waiting to retry op="aws DescribeInstances" class=throttled`)
	if waits < 3 {
		t.Errorf("%d logged waits; max_attempts must not cut a throttle short:\n%s", waits, logs.String())
	}
	if n := p.Requests(); n != int64(waits+1) {
		t.Errorf("%d requests for %d logged waits: a hidden retry layer sent more", n, waits)
	}
	if took > d.Retry.Budget+time.Second {
		t.Errorf("the call took %s with a %s budget", took, d.Retry.Budget)
	}
	t.Logf("%d requests, %d waits, %s for a %s budget", p.Requests(), waits, took.Round(time.Millisecond), d.Retry.Budget)
}

// TestUnreachableEndpoint fails at once, naming the endpoint.
func TestUnreachableEndpoint(t *testing.T) {
	d, _ := newTestDriver(t, "http://127.0.0.1:1", "", nil)
	_, err := d.HasVM(context.Background(), "i-0123456789abcdef0")
	if err == nil || !strings.Contains(err.Error(), "http://127.0.0.1:1") || errors.Is(err, retry.ErrBudgetExhausted) {
		t.Fatalf("error %v; want an immediate error naming the endpoint", err)
	}
}

// TestDiskEdges: resize, update in place, attach elsewhere.
func TestDiskEdges(t *testing.T) {
	ep := emptyMoto(t)
	d, _ := newTestDriver(t, ep, "", map[string]any{"default_availability_zone": region + "b"})
	ctx := context.Background()
	disk, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 1500, CloudProps: driver.PropsOf(map[string]any{"type": "io2", "iops": 3000})})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteDisk(ctx, disk)
	v, _ := d.volume(ctx, disk)
	if aws.ToInt32(v.Size) != 2 || v.VolumeType != "io2" || aws.ToString(v.AvailabilityZone) != region+"b" {
		t.Errorf("volume %d GiB %s in %s; want 2 GiB io2 in %sb", aws.ToInt32(v.Size), v.VolumeType, aws.ToString(v.AvailabilityZone), region)
	}
	if err := d.ResizeDisk(ctx, disk, 2048); err != nil {
		t.Errorf("resize to the same size: %v", err)
	}
	cid, err := d.UpdateDisk(ctx, disk, 4096, driver.PropsOf(map[string]any{"type": "gp3"}))
	if err != nil || cid != disk {
		t.Fatalf("update_disk = %q, %v", cid, err)
	}
	v, _ = d.volume(ctx, disk)
	if aws.ToInt32(v.Size) != 4 {
		t.Errorf("after update_disk: %d GiB; want 4", aws.ToInt32(v.Size))
	}
	if _, err := d.UpdateDisk(ctx, disk, 0, driver.PropsOf(map[string]any{"encrypted": true})); !errors.Is(err, driver.ErrNotSupported) {
		t.Errorf("update_disk to encrypted: %v; want ErrNotSupported", err)
	}
	if _, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 1024, VMCID: "i-0000000000000000f"}); !errors.Is(err, driver.ErrVMNotFound) {
		t.Errorf("create_disk near an unknown vm: %v; want ErrVMNotFound", err)
	}
}

// TestAssumeRole: with assume_role_arn the driver asks STS for the role's
// credentials once per process and signs EC2 calls with them.
func TestAssumeRole(t *testing.T) {
	ep := motoEndpoint(t)
	p, _ := faultproxy.New(ep, faultproxy.AWS)
	var mu sync.Mutex
	actions := map[string]int{}
	keys := map[string]bool{}
	p.SetRule(func(r faultproxy.Request) faultproxy.Fault {
		q, _ := url.ParseQuery(string(r.Body))
		mu.Lock()
		actions[q.Get("Action")]++
		if k := signingKey(r.Request); k != "" {
			keys[k] = true
		}
		mu.Unlock()
		return faultproxy.Pass
	})
	url, stop := p.Start()
	defer stop()
	d, _ := newTestDriver(t, url, "", map[string]any{"assume_role_arn": "arn:aws:iam::123456789012:role/runway-cpi",
		"assume_role_external_id": "ext-1", "sts_endpoint": url})
	ctx := context.Background()
	for range 3 {
		if _, err := d.HasVM(ctx, "i-0123456789abcdef0"); err != nil {
			t.Fatal(err)
		}
	}
	if actions["AssumeRole"] != 1 || actions["DescribeInstances"] != 3 {
		t.Fatalf("requests by action %v; want one AssumeRole and three DescribeInstances", actions)
	}
	if len(keys) != 2 || !keys["testing"] {
		t.Fatalf("signing keys %v; want the base key for STS and the role's for EC2", keys)
	}
}

// TestDefaultCredentialChain: without keys in the config the SDK's chain
// is used — here the environment, then a shared credentials file.
func TestDefaultCredentialChain(t *testing.T) {
	ep := motoEndpoint(t)
	p, _ := faultproxy.New(ep, faultproxy.AWS)
	var mu sync.Mutex
	var key string
	p.SetRule(func(r faultproxy.Request) faultproxy.Fault {
		if k := signingKey(r.Request); k != "" {
			mu.Lock()
			key = k
			mu.Unlock()
		}
		return faultproxy.Pass
	})
	url, stop := p.Start()
	defer stop()
	dir := t.TempDir()
	creds := filepath.Join(dir, "credentials")
	os.WriteFile(creds, []byte("[default]\naws_access_key_id = FILEKEY\naws_secret_access_key = filesecret\n"), 0o600)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", creds)
	t.Setenv("AWS_CONFIG_FILE", filepath.Join(dir, "config"))
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	for _, c := range []struct{ envKey, want string }{{"ENVKEY", "ENVKEY"}, {"", "FILEKEY"}} {
		t.Setenv("AWS_ACCESS_KEY_ID", c.envKey)
		t.Setenv("AWS_SECRET_ACCESS_KEY", map[bool]string{true: "envsecret", false: ""}[c.envKey != ""])
		b, _ := json.Marshal(map[string]any{"region": region, "endpoint": url})
		d, err := New(b, driver.Deps{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := d.HasVM(context.Background(), "i-0123456789abcdef0"); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		got := key
		mu.Unlock()
		if got != c.want {
			t.Errorf("signed with %q; want %q", got, c.want)
		}
	}
}

// signingKey is the access key id a SigV4 request was signed with.
func signingKey(r *http.Request) string {
	_, cred, ok := strings.Cut(r.Header.Get("Authorization"), "Credential=")
	if !ok {
		return ""
	}
	key, _, _ := strings.Cut(cred, "/")
	return key
}

// TestRetriedStartSnapshotLeavesOne: a StartSnapshot whose answer was lost
// is sent again; moto ignores the ClientToken, so without the sweep the
// first snapshot stays behind (found by the lifecycle audit under faults).
func TestRetriedStartSnapshotLeavesOne(t *testing.T) {
	ep := emptyMoto(t)
	p, _ := faultproxy.New(ep, faultproxy.AWS)
	var once sync.Once
	resent := false
	p.SetRule(func(r faultproxy.Request) faultproxy.Fault {
		f := faultproxy.Pass
		if r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/snapshots") {
			once.Do(func() { f, resent = faultproxy.ResetAfter, true })
		}
		return f
	})
	url, stop := p.Start()
	defer stop()
	d, _ := newTestDriver(t, url, "", nil)
	ctx := context.Background()
	img, props := stemcellFixture(t)
	tags := map[string]string{"director": "dup-stemcell"}
	ami, err := d.CreateStemcell(ctx, driver.StemcellSpec{ImagePath: img, CloudProps: props, Tags: tags})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteStemcell(ctx, ami)
	if !resent {
		t.Fatal("StartSnapshot was never faulted")
	}
	snaps, err := adminClient(t, ep).DescribeSnapshots(ctx, &ec2.DescribeSnapshotsInput{OwnerIds: []string{"self"}, Filters: tagFilters(tags)})
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps.Snapshots) != 1 {
		t.Fatalf("snapshots after a resent StartSnapshot: %d; want 1", len(snaps.Snapshots))
	}
}

// The official aws.* properties that change what is launched:
// metadata_options on every instance, encrypted/kms_key_arn on every
// volume (root, ephemeral, persistent) unless cloud properties say.
func TestOfficialMetadataOptionsAndEncryption(t *testing.T) {
	ep := emptyMoto(t)
	ctx := context.Background()
	arn := "arn:aws:kms:" + region + ":123456789012:key/runway-test"
	// moto 5.1 takes MetadataOptions and does not store them: the request
	// itself is checked, through a recording proxy.
	rec, proxy := newRecorder(t, ep)
	d, _ := newTestDriver(t, proxy, "", map[string]any{"encrypted": true, "kms_key_arn": arn,
		"metadata_options": map[string]any{"http_tokens": "required", "http_put_response_hop_limit": 2}})
	ami := registerTestImage(t, d)
	defer d.DeleteStemcell(ctx, ami)
	vm, err := d.CreateVM(ctx, driver.VMSpec{AgentID: "agent-1", StemcellCID: ami,
		CloudProps: driver.PropsOf(map[string]any{"instance_type": "t3.micro", "root_disk": map[string]any{"size": 10240},
			"ephemeral_disk": map[string]any{"size": 10240}}),
		AgentSettings: []byte(`{"agent_id":"agent-1"}`), Tags: map[string]string{"director": "official", "agent_id": "agent-1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteVM(ctx, vm.CID)
	inst, err := d.instance(ctx, vm.CID)
	if err != nil {
		t.Fatal(err)
	}
	q := rec.last("RunInstances")
	if q.Get("MetadataOptions.HttpTokens") != "required" || q.Get("MetadataOptions.HttpPutResponseHopLimit") != "2" {
		t.Errorf("RunInstances sent %v; want MetadataOptions.HttpTokens=required and HttpPutResponseHopLimit=2", q)
	}
	if len(inst.BlockDeviceMappings) != 2 {
		t.Fatalf("block devices %+v", inst.BlockDeviceMappings)
	}
	for _, m := range inst.BlockDeviceMappings {
		v, err := d.volume(ctx, aws.ToString(m.Ebs.VolumeId))
		if err != nil {
			t.Fatal(err)
		}
		if !aws.ToBool(v.Encrypted) || aws.ToString(v.KmsKeyId) != arn {
			t.Errorf("launch volume %s encrypted=%v kms=%s; want the config's key", aws.ToString(m.DeviceName), aws.ToBool(v.Encrypted), aws.ToString(v.KmsKeyId))
		}
	}
	disk, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 1024, VMCID: vm.CID, Tags: map[string]string{"director": "official"}})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteDisk(ctx, disk)
	v, err := d.volume(ctx, disk)
	if err != nil || !aws.ToBool(v.Encrypted) || aws.ToString(v.KmsKeyId) != arn {
		t.Errorf("persistent disk: %+v %v; want encrypted with the config's key", v, err)
	}
	// A disk's own "encrypted: false" wins over the default.
	plain, err := d.CreateDisk(ctx, driver.DiskSpec{SizeMiB: 1024, VMCID: vm.CID, CloudProps: driver.PropsOf(map[string]any{"encrypted": false})})
	if err != nil {
		t.Fatal(err)
	}
	defer d.DeleteDisk(ctx, plain)
	if v, err := d.volume(ctx, plain); err != nil || aws.ToBool(v.Encrypted) {
		t.Errorf("disk with encrypted false: %+v %v", v, err)
	}
}

// made runs a create the test itself makes on moto, again if moto cut the
// connection (see retrying) — unless find sees that the attempt made it
// after all: a create sent twice would conflict with itself or double.
func made[T any](t *testing.T, create func() (T, error), find func() (T, bool)) T {
	t.Helper()
	v, err := create()
	for i := 0; err != nil && classify(err).Class != retry.Permanent && i < 3; i++ {
		if f, ok := find(); ok {
			return f
		}
		v, err = create()
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// fixtures makes what an operator made beforehand, each once (made); check
// is the retrying client the finds read with.
type fixtures struct {
	t        *testing.T
	ctx      context.Context
	c, check *ec2.Client
}

func (f fixtures) vpc(cidr string, ipv6 bool) string {
	return made(f.t, func() (string, error) {
		out, err := f.c.CreateVpc(f.ctx, &ec2.CreateVpcInput{CidrBlock: &cidr, AmazonProvidedIpv6CidrBlock: aws.Bool(ipv6)})
		if err != nil {
			return "", err
		}
		return aws.ToString(out.Vpc.VpcId), nil
	}, func() (string, bool) {
		out, err := f.check.DescribeVpcs(f.ctx, &ec2.DescribeVpcsInput{Filters: []types.Filter{{Name: aws.String("cidr"), Values: []string{cidr}}}})
		if err != nil || len(out.Vpcs) == 0 {
			return "", false
		}
		return aws.ToString(out.Vpcs[0].VpcId), true
	})
}

func (f fixtures) securityGroup(name, vpc string) string {
	return made(f.t, func() (string, error) {
		out, err := f.c.CreateSecurityGroup(f.ctx, &ec2.CreateSecurityGroupInput{GroupName: &name, Description: aws.String("p"), VpcId: &vpc})
		if err != nil {
			return "", err
		}
		return aws.ToString(out.GroupId), nil
	}, func() (string, bool) {
		out, err := f.check.DescribeSecurityGroups(f.ctx, &ec2.DescribeSecurityGroupsInput{Filters: []types.Filter{
			{Name: aws.String("group-name"), Values: []string{name}}, {Name: aws.String("vpc-id"), Values: []string{vpc}}}})
		if err != nil || len(out.SecurityGroups) == 0 {
			return "", false
		}
		return aws.ToString(out.SecurityGroups[0].GroupId), true
	})
}

func (f fixtures) subnet(in *ec2.CreateSubnetInput) string {
	return made(f.t, func() (string, error) {
		out, err := f.c.CreateSubnet(f.ctx, in)
		if err != nil {
			return "", err
		}
		return aws.ToString(out.Subnet.SubnetId), nil
	}, func() (string, bool) {
		out, err := f.check.DescribeSubnets(f.ctx, &ec2.DescribeSubnetsInput{Filters: []types.Filter{
			{Name: aws.String("cidr-block"), Values: []string{aws.ToString(in.CidrBlock)}}, {Name: aws.String("vpc-id"), Values: []string{aws.ToString(in.VpcId)}}}})
		if err != nil || len(out.Subnets) == 0 {
			return "", false
		}
		return aws.ToString(out.Subnets[0].SubnetId), true
	})
}
