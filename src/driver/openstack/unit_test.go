package openstack

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/poll"
	"github.com/runway-cpi/runway/src/retry"
)

func TestConfigErrors(t *testing.T) {
	for cfg, want := range map[string]string{
		`{}`:                      "auth_url is required",
		`{"auth_url": "ftp://x"}`: "must be an http(s) URL",
		`{"auth_url": "http://k:5000/v2.0", "username": "u"}`:                                                                        "Keystone v2.0",
		`{"auth_url": "http://k:5000"}`:                                                                                              "username or user_id is required",
		`{"auth_url": "http://k:5000", "username": "u"}`:                                                                             "password is required",
		`{"auth_url": "http://k:5000", "username": "u", "password": "p"}`:                                                            "project_name or project_id is required",
		`{"auth_url": "http://k:5000", "application_credential_id": "a"}`:                                                            "application_credential_secret is required",
		`{"auth_url": "http://k:5000", "application_credential_name": "a", "application_credential_secret": "s"}`:                    "needs username",
		`{"auth_url": "http://k:5000", "application_credential_id": "a", "application_credential_secret": "s", "project_name": "p"}`: "already scoped",
		`{"auth_url": "http://k:5000", "username": "u", "password": "p", "project_id": "x", "interface": "private"}`:                 "interface",
		`{"auth_url": "http://k:5000", "username": "u", "password": "p", "project_id": "x", "poll_max_ms": -1}`:                      "poll_max_ms",
		`{"auth_url": "http://k:5000", "username": "u", "password": "p", "project_id": "x", "ca_cert": "a", "ca_file": "b"}`:         "not both",
		`{"auth_url": "http://k:5000", "usename": "typo"}`:                                                                           "usename",
	} {
		_, err := parseConfig([]byte(cfg))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want an error saying %q", cfg, err, want)
		}
	}
	c, err := parseConfig([]byte(`{"auth_url": "http://k:5000/", "username": "u", "password": "p", "project_name": "x"}`))
	if err != nil {
		t.Fatal(err)
	}
	if c.AuthURL != "http://k:5000/v3" || c.UserDomainName != "Default" || c.ProjectDomainName != "Default" || c.Interface != "public" {
		t.Errorf("defaults: %+v", c)
	}
	if !c.tokenCache() {
		t.Error("the token cache is on by default")
	}
}

func TestCACertMustBePEM(t *testing.T) {
	c := Config{CACert: "not a certificate"}
	if _, err := c.httpClient(); err == nil || !strings.Contains(err.Error(), "no PEM certificate") {
		t.Fatalf("bad ca_cert: %v", err)
	}
	if _, err := (Config{CAFile: filepath.Join(t.TempDir(), "missing.pem")}).httpClient(); err == nil {
		t.Fatal("a missing ca_file was accepted")
	}
	hc, err := (Config{}).httpClient()
	if err != nil {
		t.Fatal(err)
	}
	if tr := hc.Transport.(*http.Transport); tr.TLSClientConfig != nil && tr.TLSClientConfig.InsecureSkipVerify {
		t.Fatal("TLS verification is off by default")
	}
}

func respErr(code int, hdr http.Header, body string) error {
	return gophercloud.ErrUnexpectedResponseCode{Actual: code, ResponseHeader: hdr, Body: []byte(body)}
}

func TestClassify(t *testing.T) {
	for name, tc := range map[string]struct {
		err   error
		class retry.Class
		after time.Duration
	}{
		"413 overLimit with body retryAfter": {respErr(413, nil, `{"overLimit": {"code": 413, "retryAfter": "7"}}`), retry.Throttle, 7 * time.Second},
		"429 with Retry-After":               {respErr(429, http.Header{"Retry-After": {"3"}}, `{}`), retry.Throttle, 3 * time.Second},
		"503":                                {respErr(503, nil, ``), retry.Transient, 0},
		"504":                                {respErr(504, nil, ``), retry.Transient, 0},
		"404":                                {respErr(404, nil, ``), retry.Permanent, 0},
		"400":                                {respErr(400, nil, ``), retry.Permanent, 0},
		"reset":                              {errors.New("read tcp: connection reset by peer"), retry.Transient, 0},
		"eof":                                {io.ErrUnexpectedEOF, retry.Transient, 0},
		"other":                              {errors.New("boom"), retry.Permanent, 0},
	} {
		v := classify(tc.err)
		if v.Class != tc.class || v.RetryAfter != tc.after {
			t.Errorf("%s: %+v; want %v after %s", name, v, tc.class, tc.after)
		}
	}
}

func TestCloudErrReadsTheMessage(t *testing.T) {
	d := &Driver{cfg: Config{AuthURL: "http://k/v3"}}
	err := d.cloudErr("create server", respErr(400, nil, `{"badRequest": {"code": 400, "message": "Invalid flavorRef provided."}}`))
	if err.Error() != "openstack create server (http://k/v3): HTTP 400: Invalid flavorRef provided." || status(err) != 400 {
		t.Errorf("cloudErr = %q (status %d)", err, status(err))
	}
	throttled := d.cloudErr("get server", &retry.BudgetError{Op: "x", Last: respErr(429, nil, `{}`)})
	if !strings.Contains(throttled.Error(), "rate limited") {
		t.Errorf("a throttle past the budget reads %q", throttled)
	}
}

func TestValidCID(t *testing.T) {
	good := "0cb53bac-8a01-4e9a-b083-d40f5b3d7c59"
	for _, cid := range []string{"", "..", "../x", "/etc/passwd", "i-0123456789abcdef0", good + "/..", "{" + good + "}", "urn:uuid:" + good,
		"0cb53bac8a014e9ab083d40f5b3d7c59"} {
		if _, err := validCID("vm", cid); !errors.Is(err, driver.ErrInvalidInput) {
			t.Errorf("validCID(%q) = %v", cid, err)
		}
	}
	if id, err := validCID("stemcell", good+" light"); err != nil || id != good {
		t.Errorf("light stemcell cid: %q, %v", id, err)
	}
	if _, err := validCID("vm", good+" light"); err == nil {
		t.Error("a light suffix on a vm cid was accepted")
	}
}

func TestTagsAndMetadataLimits(t *testing.T) {
	long := strings.Repeat("é", 200) // 400 bytes
	md := metadata(map[string]string{"k": long, "": "dropped"})
	if len(md) != 1 || len(md["k"]) > 255 || !strings.HasPrefix(long, md["k"]) {
		t.Errorf("metadata clipped badly: %d bytes", len(md["k"]))
	}
	tags := serverTags(map[string]string{"director": "a,b/c", "agent_id": strings.Repeat("x", 100)})
	for _, tg := range tags {
		if len(tg) > 60 || strings.ContainsAny(tg, ",/") {
			t.Errorf("tag %q breaks Nova's rules", tg)
		}
	}
}

func TestOpenImage(t *testing.T) {
	payload := bytes.Repeat([]byte("stemcell"), 1000)
	dir := t.TempDir()
	raw := filepath.Join(dir, "raw")
	os.WriteFile(raw, payload, 0o600)

	var tgz bytes.Buffer
	gz := gzip.NewWriter(&tgz)
	tw := tar.NewWriter(gz)
	tw.WriteHeader(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755})
	tw.WriteHeader(&tar.Header{Name: "root.img", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(payload))})
	tw.Write(payload)
	tw.Close()
	gz.Close()
	tarball := filepath.Join(dir, "image")
	os.WriteFile(tarball, tgz.Bytes(), 0o600)

	for _, p := range []string{raw, tarball} {
		r, done, err := openImage(p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(r)
		done()
		if err != nil || !bytes.Equal(got, payload) {
			t.Errorf("%s: read %d bytes, %v; want the %d-byte image", filepath.Base(p), len(got), err, len(payload))
		}
	}
	if _, _, err := openImage(filepath.Join(dir, "missing")); !errors.Is(err, errBadImage) {
		t.Errorf("missing image: %v", err)
	}
}

func TestSecretsAreRedacted(t *testing.T) {
	var got []string
	_, err := New([]byte(`{"auth_url": "http://k:5000", "username": "u", "password": "hunter2", "project_name": "p"}`),
		driver.Deps{StateDir: t.TempDir(), Redact: func(v ...string) { got = append(got, v...) }})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(strings.Join(got, " "), "hunter2") {
		t.Errorf("the password was not registered for redaction: %q", got)
	}
}

// The official openstack_cpi job's properties, as its template renders
// them into cloud.properties.openstack, mean what they mean there.
func TestOfficialJobPropertiesByTheirNamesAndUnits(t *testing.T) {
	c, err := parseConfig([]byte(`{"auth_url": "https://keystone.example:5000/v3", "username": "bosh", "api_key": "pw",
		"project": "prod", "domain": "corp", "region": "r1", "endpoint_type": "internalURL", "state_timeout": 450,
		"wait_resource_poll_interval": 3, "boot_from_volume": true, "default_volume_type": "SSD",
		"default_key_name": "bosh", "default_security_groups": ["bosh"], "config_drive": "disk", "use_dhcp": false,
		"ignore_server_availability_zone": true, "human_readable_vm_names": true, "stemcell_public_visibility": true,
		"use_nova_networking": false, "connection_options": {"ssl_verify_peer": false, "read_timeout": 360, "connect_timeout": 30}}`))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{AuthURL: "https://keystone.example:5000/v3", Username: "bosh", Password: "pw", ProjectName: "prod",
		DomainName: "corp", UserDomainName: "corp", ProjectDomainName: "corp", Region: "r1", Interface: "internal",
		Polling: poll.Polling{WaitTimeoutSeconds: 450, PollMaxMilli: 3000}, BootFromVolume: true, DefaultVolumeType: "SSD",
		DefaultKeyName: "bosh", DefaultSecurityGroups: []string{"bosh"}, ConfigDrive: "disk", UseDHCP: new(false),
		IgnoreServerAvailabilityZone: true, HumanReadableVMNames: true, StemcellPublicVisibility: true,
		Insecure: true, RequestTimeoutSeconds: 360}
	if !reflect.DeepEqual(c, want) {
		t.Fatalf("got  %+v\nwant %+v", c, want)
	}
	if c.useDHCP() || !c.ConfigDrive.Enabled() {
		t.Fatal("use_dhcp false, config_drive disk")
	}
	base := `{"auth_url": "http://k:5000/v3", "username": "u", "project": "p", `
	for cfg, want := range map[string]string{
		base + `"api_key": "a", "password": "b"}`:                      "api_key and password name the same setting",
		base + `"api_key": "a", "use_nova_networking": true}`:          "use_nova_networking is not supported",
		base + `"api_key": "a", "enable_auto_anti_affinity": true}`:    "enable_auto_anti_affinity is not supported",
		base + `"api_key": "a", "endpoint_type": "privateURL"}`:        "endpoint_type privateURL",
		base + `"api_key": "a", "config_drive": "floppy"}`:             "config_drive must be cdrom, disk",
		base + `"api_key": "a", "connection_options": {"proxy": "x"}}`: "connection_options.proxy is not supported",
		base + `"api_key": "a", "wait_resource_poll_interval": 0}`:     "wait_resource_poll_interval must be a positive",
		base + `"api_key": "a", "default_key": "k"}`:                   `unknown key "default_key" (did you mean "default_key_name"?)`,
		base + `"apikey": "a"}`:                                        `unknown key "apikey" (did you mean "api_key"?)`,
	} {
		if _, err := parseConfig([]byte(cfg)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want an error saying %q", cfg, err, want)
		}
	}
	// config_drive as a boolean (Runway's form) still works; the use_dhcp
	// default is the official CPI's: on.
	c, err = parseConfig([]byte(base + `"api_key": "a", "config_drive": true}`))
	if err != nil || !c.ConfigDrive.Enabled() || !c.useDHCP() {
		t.Fatalf("%+v %v", c, err)
	}
}

func TestAgentUserDataAsTheOfficialCPIWritesIt(t *testing.T) {
	in := []byte(`{"agent_id": "a", "disks": {"system": "/dev/sda", "ephemeral": "/dev/sdb", "persistent": {}},
		"networks": {"private": {"type": "manual", "ip": "10.0.0.5"}, "public": {"type": "vip", "ip": "1.2.3.4"}}}`)
	var got struct {
		Networks map[string]map[string]any `json:"networks"`
		Disks    map[string]any            `json:"disks"`
	}
	if err := json.Unmarshal(agentUserData(in, false, false), &got); err != nil {
		t.Fatal(err)
	}
	if got.Networks["private"]["use_dhcp"] != false || got.Networks["private"]["ip"] != "10.0.0.5" {
		t.Errorf("private = %v", got.Networks["private"])
	}
	if _, set := got.Networks["public"]["use_dhcp"]; set {
		t.Errorf("vip = %v", got.Networks["public"])
	}
	// A flavor without an ephemeral disk: the agent is told there is none.
	if e, set := got.Disks["ephemeral"]; !set || e != nil || got.Disks["system"] != "/dev/sda" {
		t.Errorf("disks = %v", got.Disks)
	}
	got.Disks = nil
	if err := json.Unmarshal(agentUserData(in, true, true), &got); err != nil {
		t.Fatal(err)
	}
	if got.Disks["ephemeral"] != "/dev/sdb" || got.Networks["private"]["use_dhcp"] != true {
		t.Errorf("with an ephemeral flavor: %v %v", got.Disks, got.Networks)
	}
	if string(agentUserData([]byte("#!/bin/sh\n"), true, false)) != "#!/bin/sh\n" {
		t.Error("a caller's user data script must pass unchanged")
	}
}

func TestOfficialVMPropertiesAreCheckedBeforeAnythingIsMade(t *testing.T) {
	for props, want := range map[string]string{
		`{"instance_type": "m", "root_disk": {"size": 0}}`:                                 "root_disk.size is 0; it is in GiB",
		`{"instance_type": "m", "ephemeral_disk": {"size": 1024}}`:                         "ephemeral_disk is not supported",
		`{"instance_type": "m", "availability_zone": "a", "availability_zones": ["b"]}`:    "only one of availability_zone and availability_zones",
		`{"instance_type": "m", "availability_zones": ["a", "b"]}`:                         "ignore_server_availability_zone",
		`{"instance_type": "m", "allowed_address_pairs": "vrrp"}`:                          `"vrrp" is not an IP address`,
		`{"instance_type": "m", "loadbalancer_pools": [{"port": 80}]}`:                     "loadbalancer_pools[0] has no name",
		`{"instance_type": "m", "loadbalancer_pools": [{"name": "p", "port": 0}]}`:         "port 0 is not a TCP port",
		`{"instance_type": "m", "scheduler_hint": {}}`:                                     `"scheduler_hint" (did you mean "scheduler_hints"?)`,
		`{"instance_type": "m", "availability_zones": ["a"], "root_disk": {"size": "10"}}`: "root_disk.size",
	} {
		var p vmProps
		err := driver.PropsOf(json.RawMessage(props)).Decode("cloud_properties", &p)
		if err == nil {
			err = p.validate(false)
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want %q", props, err, want)
		}
	}
	var p vmProps
	if err := driver.PropsOf(json.RawMessage(`{"instance_type": "m", "availability_zones": ["a", "b"], "root_disk": {"size": 10},
		"scheduler_hints": {"group": "g"}, "allowed_address_pairs": "10.0.0.9", "vrrp_port_check": false}`)).Decode("cloud_properties", &p); err != nil {
		t.Fatal(err)
	}
	if err := p.validate(true); err != nil || p.RootDisk.SizeGiB != 10 || p.SchedulerHints["group"] != "g" {
		t.Fatalf("%+v %v", p, err)
	}
}

func TestStemcellImagePropertiesAsTheOfficialCPIPassesThem(t *testing.T) {
	var p stemcellProps
	if err := driver.PropsOf(json.RawMessage(`{"name": "bosh-openstack-kvm-ubuntu-jammy", "version": 1.5, "hypervisor": "kvm",
		"os_type": "linux", "auto_disk_config": true, "hw_vif_model": "virtio", "hw_disk_bus": "scsi", "hw_scsi_model": "virtio-scsi",
		"vmware_linked_clone": false, "architecture": "x86_64", "os_distro": "ubuntu"}`)).Decode("cloud_properties", &p); err != nil {
		t.Fatal(err)
	}
	got, err := p.imageProperties()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"version": "1.5", "hypervisor_type": "kvm", "os_type": "linux", "auto_disk_config": "true",
		"hw_vif_model": "virtio", "hw_disk_bus": "scsi", "hw_scsi_model": "virtio-scsi", "vmware_linked_clone": "false",
		"architecture": "x86_64", "os_distro": "ubuntu"}
	if !maps.Equal(got, want) {
		t.Errorf("image properties = %v\nwant %v", got, want)
	}
	p = stemcellProps{Hypervisor: "kvm", HypervisorType: "qemu"}
	if _, err := p.imageProperties(); err == nil {
		t.Error("hypervisor and hypervisor_type together must be refused")
	}
	p = stemcellProps{OSType: map[string]any{}}
	if _, err := p.imageProperties(); err == nil || !strings.Contains(err.Error(), "os_type") {
		t.Errorf("an object as os_type: %v", err)
	}
}
