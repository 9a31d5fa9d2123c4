package aws

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"

	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/cloudtags"
	"github.com/runway-cpi/runway/src/retry"
)

func TestConfigErrors(t *testing.T) {
	for cfg, want := range map[string]string{
		`{}`: "region is required",
		`{"region":"us-east-1","endpoint":"ftp://x"}`:                          "must be an http(s) URL",
		`{"region":"us-east-1","credentials_source":"magic"}`:                  "want static, env_or_profile or default",
		`{"region":"us-east-1","credentials_source":"static"}`:                 "needs access_key_id and secret_access_key",
		`{"region":"us-east-1","max_attempts":-1}`:                             "max_attempts must not be negative",
		`{"region":"us-east-1","regoin":"x"}`:                                  "regoin",
		`{"region":"us-east-1","access_key_id":"a","secret_access_key":["x"]}`: "secret_access_key",
	} {
		_, err := New([]byte(cfg), driver.Deps{})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %s: error %v; want it to mention %q", cfg, err, want)
		}
	}
	d, err := New([]byte(`{"region":"eu-west-1","access_key_id":"AK","secret_access_key":"SK"}`), driver.Deps{})
	if err != nil {
		t.Fatal(err)
	}
	if d.cfg.CredentialsSource != "static" || d.cfg.MaxAttempts != DefaultMaxAttempts {
		t.Fatalf("defaults not applied: %+v", d.cfg)
	}
}

func TestSecretsAreRedacted(t *testing.T) {
	var got []string
	_, err := New([]byte(`{"region":"eu-west-1","access_key_id":"AK","secret_access_key":"s3cr3t","session_token":"t0k3n"}`),
		driver.Deps{Redact: func(v ...string) { got = append(got, v...) }})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(got, ",") != "s3cr3t,t0k3n" {
		t.Fatalf("redacted %v; want the secret key and session token", got)
	}
}

func apiErr(status int, code string) error {
	return &smithy.OperationError{ServiceID: "EC2", OperationName: "X", Err: &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
			Err: &smithy.GenericAPIError{Code: code, Message: "m"}}}}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want retry.Class
	}{
		{apiErr(503, "RequestLimitExceeded"), retry.Throttle},
		{apiErr(400, "Throttling"), retry.Throttle},
		{apiErr(429, "ThrottlingException"), retry.Throttle},
		{apiErr(429, ""), retry.Throttle},
		{apiErr(500, "InternalError"), retry.Transient},
		{apiErr(503, "Unavailable"), retry.Transient},
		{apiErr(502, ""), retry.Transient},
		{apiErr(400, "InvalidParameterValue"), retry.Permanent},
		{apiErr(400, "InvalidInstanceID.NotFound"), retry.Permanent},
		{fmt.Errorf("send: %w", &net.OpError{Op: "read", Err: os.NewSyscallError("read", syscall.ECONNRESET)}), retry.Transient},
		{fmt.Errorf("send: %w", io.ErrUnexpectedEOF), retry.Transient},
		{fmt.Errorf("dial: %w", &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}), retry.Permanent},
		{fmt.Errorf("dial: %w", &net.DNSError{Err: "no such host", Name: "ec2.example", IsNotFound: true}), retry.Permanent},
		{errors.New("something else"), retry.Permanent},
		// A 200 whose body broke off (the SDK's deserialization error).
		{&smithy.OperationError{ServiceID: "EC2", OperationName: "X", Err: &awshttp.ResponseError{
			ResponseError: &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: 200}},
				Err: &smithy.DeserializationError{Err: &net.OpError{Op: "read", Err: net.ErrClosed}}}}}, retry.Transient},
		// The same for an error answer: its code never arrived (seen with
		// moto under load: "failed to copy error response body").
		{&smithy.OperationError{ServiceID: "EC2", OperationName: "X", Err: &awshttp.ResponseError{
			ResponseError: &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: 400}},
				Err: &smithy.DeserializationError{Err: &net.OpError{Op: "read", Err: net.ErrClosed}}}}}, retry.Transient},
		{apiErr(400, ""), retry.Permanent},
	} {
		if got := classify(c.err).Class; got != c.want {
			t.Errorf("classify(%v) = %s; want %s", c.err, got, c.want)
		}
	}
}

func TestCIDValidation(t *testing.T) {
	ok := map[string][]string{"vm": {"i-0123456789abcdef0", "i-12345678"}, "disk": {"vol-0123456789abcdef0"},
		"snapshot": {"snap-0123456789abcdef0"}, "stemcell": {"ami-0123456789abcdef0", "ami-0123456789abcdef0 light"}}
	bad := map[string][]string{"vm": {"vol-0123456789abcdef0", "i-XYZ12345", "i-12345678 ", "i-12345678/.."},
		"disk": {"i-0123456789abcdef0", "vol-../../x"}, "snapshot": {"vol-0123456789abcdef0"},
		"stemcell": {"ami-12345678 heavy", "ami-12345678\nx"}}
	for kind, cids := range ok {
		for _, c := range cids {
			if err := validCID(kind, c); err != nil {
				t.Errorf("validCID(%s, %q) = %v", kind, c, err)
			}
		}
		for _, c := range append(bad[kind], "", "..", "../x", "a/b", "/etc/passwd") {
			if err := validCID(kind, c); !errors.Is(err, driver.ErrInvalidInput) {
				t.Errorf("validCID(%s, %q) = %v; want ErrInvalidInput", kind, c, err)
			}
		}
	}
}

func TestCalculateVMCloudProperties(t *testing.T) {
	d := &Driver{}
	for _, c := range []struct {
		r    driver.Resources
		want string
	}{
		{driver.Resources{CPU: 1, RAM: 512}, "t3.micro"},
		{driver.Resources{CPU: 2, RAM: 4096}, "t3.medium"},
		{driver.Resources{CPU: 4, RAM: 8192}, "c6i.xlarge"},
		{driver.Resources{CPU: 2, RAM: 12000}, "r6i.large"},
		{driver.Resources{CPU: 96, RAM: 400000}, "m6i.32xlarge"},
	} {
		p, err := d.CalculateVMCloudProperties(context.Background(), c.r)
		if err != nil || p.Map()["instance_type"] != c.want {
			t.Errorf("%+v → %v, %v; want %s", c.r, p, err, c.want)
		}
	}
	p, _ := d.CalculateVMCloudProperties(context.Background(), driver.Resources{CPU: 1, RAM: 1, EphemeralDiskSize: 10240})
	if e, _ := p.Map()["ephemeral_disk"].(map[string]any); e["size"] != 10240.0 {
		t.Errorf("ephemeral disk not carried: %v", p)
	}
	if _, err := d.CalculateVMCloudProperties(context.Background(), driver.Resources{CPU: 1000}); !errors.Is(err, driver.ErrInvalidInput) {
		t.Errorf("impossible size: %v; want ErrInvalidInput", err)
	}
	// The table is cheapest-first: no later type may be smaller in both
	// dimensions than an earlier one (it would never be chosen).
	for i, a := range instanceTypes {
		for _, b := range instanceTypes[i+1:] {
			if b.CPU <= a.CPU && b.RAMMiB <= a.RAMMiB {
				t.Errorf("%s comes after %s but is no bigger", b.Name, a.Name)
			}
		}
	}
}

func TestEC2Tags(t *testing.T) {
	long := strings.Repeat("v", 300)
	got := tagMap(ec2Tags(map[string]string{"aws:reserved": "x", "": "y", "k": long, strings.Repeat("k", 200): "v"}))
	if _, ok := got["aws:reserved"]; ok || len(got) != 2 {
		t.Fatalf("tags %v: reserved or empty keys kept", got)
	}
	if len(got["k"]) != 256 || len(got[strings.Repeat("k", 128)]) != 1 {
		t.Fatalf("tags not truncated to EC2's limits: %v", got)
	}
}

// rawImage returns a disk image with data in blocks 0 and 2 of 3.
func rawImage() []byte {
	img := make([]byte, 2*ebsBlock+1000)
	copy(img, "bootsector")
	copy(img[2*ebsBlock:], "third block")
	return img
}

func writeStemcellImage(t *testing.T, raw []byte, gz, tarred bool) string {
	t.Helper()
	var buf bytes.Buffer
	var w io.Writer = &buf
	var zw *gzip.Writer
	if gz {
		zw = gzip.NewWriter(&buf)
		w = zw
	}
	if tarred {
		tw := tar.NewWriter(w)
		tw.WriteHeader(&tar.Header{Name: "./stemcell.MF", Mode: 0o644, Size: 3, Typeflag: tar.TypeReg})
		tw.Write([]byte("---"))
		tw.WriteHeader(&tar.Header{Name: "./root.img", Mode: 0o644, Size: int64(len(raw)), Typeflag: tar.TypeReg})
		tw.Write(raw)
		tw.Close()
	} else {
		w.Write(raw)
	}
	if zw != nil {
		zw.Close()
	}
	p := filepath.Join(t.TempDir(), "image")
	if err := os.WriteFile(p, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestOpenRaw(t *testing.T) {
	raw := rawImage()
	for _, c := range []struct {
		gz, tarred bool
		size       int64
	}{{true, true, int64(len(raw))}, {false, true, int64(len(raw))}, {false, false, int64(len(raw))}, {true, false, -1}} {
		r, size, closeF, err := openRaw(writeStemcellImage(t, raw, c.gz, c.tarred))
		if err != nil {
			t.Fatalf("gz=%v tar=%v: %v", c.gz, c.tarred, err)
		}
		got, _ := io.ReadAll(r)
		closeF()
		if !bytes.Equal(got, raw) || size != c.size {
			t.Errorf("gz=%v tar=%v: read %d bytes, size %d; want %d bytes, size %d", c.gz, c.tarred, len(got), size, len(raw), c.size)
		}
	}
	if _, _, _, err := openRaw(filepath.Join(t.TempDir(), "missing")); !errors.Is(err, driver.ErrInvalidInput) {
		t.Errorf("missing image: %v; want ErrInvalidInput", err)
	}
}

// TestIAMPolicyMatchesTheCode: docs/aws-iam-policy.json allows exactly
// the EC2 and EBS operations the driver calls (minimal, and sufficient).
func TestIAMPolicyMatchesTheCode(t *testing.T) {
	var policy struct {
		Statement []struct {
			Action any
		}
	}
	b, err := os.ReadFile("../../../docs/aws-iam-policy.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &policy); err != nil {
		t.Fatal(err)
	}
	allowed := map[string]bool{}
	for _, s := range policy.Statement {
		switch a := s.Action.(type) {
		case string:
			allowed[a] = true
		case []any:
			for _, x := range a {
				allowed[x.(string)] = true
			}
		}
	}
	used := map[string]bool{}
	files, _ := filepath.Glob("*.go")
	// c: EC2, eb: EBS direct, lb1/lb2: classic ELB and ELBv2 (one IAM prefix).
	call := regexp.MustCompile(`\b(c|eb|lb1|lb2)\.([A-Z][A-Za-z]+)\(ctx`)
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, _ := os.ReadFile(f)
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			used[map[string]string{"c": "ec2:", "eb": "ebs:", "lb1": "elasticloadbalancing:", "lb2": "elasticloadbalancing:"}[m[1]]+m[2]] = true
		}
	}
	if len(used) < 20 {
		t.Fatalf("found only %d operations in the code: %v", len(used), used)
	}
	for op := range used {
		if !allowed[op] {
			t.Errorf("the driver calls %s but the IAM policy does not allow it", op)
		}
	}
	for a := range allowed {
		if !used[a] && a != "iam:PassRole" {
			t.Errorf("the IAM policy allows %s, which the driver never calls", a)
		}
	}
}

// The official aws_cpi job's properties, as its template renders them
// into cloud.properties.aws, mean what they mean there.
func TestOfficialJobPropertiesByTheirNames(t *testing.T) {
	c, err := parseConfig([]byte(`{"credentials_source": "env_or_profile", "region": "eu-central-1",
		"ec2_endpoint": "ec2.eu-central-1.amazonaws.com", "elb_endpoint": "https://elb.example", "max_retries": 8,
		"role_arn": "arn:aws:iam::1:role/bosh", "default_key_name": "bosh", "default_security_groups": ["bosh"],
		"default_iam_instance_profile": "prof", "encrypted": true, "kms_key_arn": "arn:aws:kms:eu-central-1:1:key/k",
		"metadata_options": {"http_tokens": "required"}, "dualstack": false, "enable_describe_instance_types": true,
		"access_key_id": null, "secret_access_key": null, "session_token": null}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.CredentialsSource != "default" || c.Endpoint != "https://ec2.eu-central-1.amazonaws.com" || c.MaxAttempts != 9 ||
		c.AssumeRoleARN != "arn:aws:iam::1:role/bosh" || !c.Encrypted || c.MetadataOptions.HTTPTokens != "required" ||
		c.ELBEndpoint != "https://elb.example" {
		t.Fatalf("config %+v", c)
	}
	// elb_endpoint as an operator writes it: a host and port, https assumed.
	if c, err := parseConfig([]byte(`{"region": "r", "elb_endpoint": "elb.eu-central-1.amazonaws.com:443"}`)); err != nil ||
		c.ELBEndpoint != "https://elb.eu-central-1.amazonaws.com:443" {
		t.Errorf("elb_endpoint host:port: %q, %v", c.ELBEndpoint, err)
	}
	for cfg, want := range map[string]string{
		`{"region": "r", "dualstack": true}`:                                "dualstack is not supported",
		`{"region": "r", "stemcell": {"kernel_id": "aki-1"}}`:               "stemcell is not supported",
		`{"region": "r", "kms_key_arn": "arn:k"}`:                           "kms_key_arn needs encrypted",
		`{"region": "r", "connection_options": {"ssl_verify_peer": false}}`: "connection_options.ssl_verify_peer is not supported",
		`{"region": "r", "connection_options": {"ca_cert": "not pem"}}`:     "ca_cert holds no PEM",
		`{"region": "r", "max_retries": 2, "max_attempts": 5}`:              "max_retries and max_attempts name the same setting",
		`{"region": "r", "metadata_options": {"http_token": "required"}}`:   `unknown key "http_token" (did you mean "http_tokens"?)`,
		`{"region": "r", "default_security_group": ["a"]}`:                  `did you mean "default_security_groups"?`,
	} {
		if _, err := parseConfig([]byte(cfg)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want an error saying %q", cfg, err, want)
		}
	}
}

// Each network's address is found where planNICs put it: the instance's
// own addresses, interface i's private address, its IPv6 address; prefix
// networks are no address.
func TestAddressesOfSeveralInterfaces(t *testing.T) {
	nets := driver.Networks{
		"a":   {Type: "manual", IP: "10.0.0.5", NICGroup: "g", Default: []string{"gateway"}, CloudProperties: driver.PropsOf(map[string]any{"subnet": "s1"})},
		"a6":  {Type: "manual", IP: "2001:db8::5", NICGroup: "g", CloudProperties: driver.PropsOf(map[string]any{"subnet": "s1"})},
		"pfx": {Type: "manual", IP: "10.0.0.16", Prefix: "28", NICGroup: "g", CloudProperties: driver.PropsOf(map[string]any{"subnet": "s1"})},
		"b":   {Type: "manual", IP: "10.1.0.5", CloudProperties: driver.PropsOf(map[string]any{"subnet": "s2"})},
		"pub": {Type: "vip", IP: "203.0.113.9"},
	}
	var p vmProps
	plan, err := planNICs(nets, &p)
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.nics) != 2 || plan.nics[0].group != "g" || plan.nics[0].prefix4 != "10.0.0.16/28" || plan.nics[0].ipv6 != "2001:db8::5" {
		t.Fatalf("plan %+v", plan)
	}
	inst := types.Instance{PrivateIpAddress: aws.String("10.0.0.5"), PublicIpAddress: aws.String("203.0.113.9"),
		NetworkInterfaces: []types.InstanceNetworkInterface{
			{Attachment: &types.InstanceNetworkInterfaceAttachment{DeviceIndex: aws.Int32(0)}, PrivateIpAddress: aws.String("10.0.0.5"),
				Ipv6Addresses: []types.InstanceIpv6Address{{Ipv6Address: aws.String("2001:db8::5")}}},
			{Attachment: &types.InstanceNetworkInterfaceAttachment{DeviceIndex: aws.Int32(1)}, PrivateIpAddress: aws.String("10.1.0.5")}}}
	got := map[string]string{}
	for name, which := range cloudtags.DecodeNames(plan.names(nets)) {
		got[name] = address(inst, which)
	}
	want := map[string]string{"a": "10.0.0.5", "a6": "2001:db8::5", "b": "10.1.0.5", "pub": "203.0.113.9"}
	if !maps.Equal(got, want) {
		t.Errorf("addresses %v; want %v", got, want)
	}
	for name, n := range map[string]driver.Network{
		"prefix only":  {Type: "manual", IP: "10.0.0.16", Prefix: "28", CloudProperties: driver.PropsOf(map[string]any{"subnet": "s"})},
		"prefix /24":   {Type: "manual", IP: "10.0.0.0", Prefix: "24", NICGroup: "a", CloudProperties: driver.PropsOf(map[string]any{"subnet": "s1"})},
		"other subnet": {Type: "manual", IP: "10.9.0.5", NICGroup: "g", CloudProperties: driver.PropsOf(map[string]any{"subnet": "s9"})},
	} {
		bad := driver.Networks{"a": nets["a"], "x": n}
		if _, err := planNICs(bad, &vmProps{}); !errors.Is(err, driver.ErrInvalidInput) {
			t.Errorf("%s: %v; want ErrInvalidInput", name, err)
		}
	}
}
