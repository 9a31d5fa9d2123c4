package vsphere

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vmdk"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/lock"
	"github.com/runway-cpi/runway/src/logging"
	"github.com/runway-cpi/runway/src/retry"
)

// vcsim is govmomi's vCenter simulator in this process: two datacenters,
// each with two clusters of one host, a child resource pool per cluster,
// two datastores every host mounts, a distributed port group and "VM
// Network".
type vcsim struct {
	model  *simulator.Model
	server *simulator.Server
	host   string
	user   string
	pass   string
	caPEM  string
}

func newSim(t testing.TB) *vcsim {
	t.Helper()
	m := simulator.VPX()
	m.Datacenter, m.Cluster, m.ClusterHost, m.Host, m.Pool, m.Datastore, m.Machine, m.Portgroup = 2, 2, 1, 0, 1, 2, 0, 1
	if err := m.Create(); err != nil {
		t.Fatal(err)
	}
	m.Service.TLS = new(tls.Config)
	// An account of its own: vcsim then checks the password (its default
	// one, "pass", is a word errors contain).
	m.Service.Listen = &url.URL{User: url.UserPassword("bosh@vsphere.local", "vc-secret-0471")}
	s := m.Service.NewServer()
	t.Cleanup(func() { s.Close(); m.Remove() })
	pw, _ := s.URL.User.Password()
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
	return &vcsim{model: m, server: s, host: s.URL.Host, user: s.URL.User.Username(), pass: pw, caPEM: string(ca)}
}

// section is the driver's config for datacenter DC0 (extra keys over it).
func (v *vcsim) section(extra map[string]any) json.RawMessage {
	c := map[string]any{
		"host": v.host, "user": v.user, "password": v.pass,
		"connection_options": map[string]any{"ca_cert": v.caPEM},
		"datacenters": []any{map[string]any{
			"name": "DC0", "datastore_pattern": `\ALocalDS_`, "persistent_datastore_pattern": `\ALocalDS_`,
			"clusters": []any{"DC0_C0", map[string]any{"DC0_C1": map[string]any{"resource_pool": "DC0_C1_RP1"}}},
		}},
		"poll_max_ms": 50,
	}
	for k, x := range extra {
		c[k] = x
	}
	b, _ := json.Marshal(c)
	return b
}

// newDriver is a driver on the simulator with a fast wait budget.
func (v *vcsim) newDriver(t testing.TB, extra map[string]any) *Driver {
	t.Helper()
	dir := t.TempDir()
	locks, err := lock.New(filepath.Join(dir, "locks"), 30*time.Second, logging.Discard())
	if err != nil {
		t.Fatal(err)
	}
	p := retry.Default()
	p.Base, p.MaxSleep, p.Budget = time.Millisecond, 10*time.Millisecond, 500*time.Millisecond
	d, err := New(v.section(extra), driver.Deps{StateDir: dir, Locker: locks, Retry: p, Logger: logging.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// stemcellImage is a stemcell's image as the Director hands it over: a
// gzipped tarball of image.ovf (testdata: the shape ovftool gives the
// stemcell builder's VMX) and a streamOptimized vmdk.
func stemcellImage(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	disk := filepath.Join(dir, "image-disk1.vmdk")
	w, err := vmdk.NewStreamOptimizedWriter(disk, 3<<30)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Write(bytes.NewReader(make([]byte, 64<<10))); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	ovfDesc, err := os.ReadFile("testdata/image.ovf")
	if err != nil {
		t.Fatal(err)
	}
	// vcsim's OVF import refuses SATA controllers (resource type 20),
	// which vCenter takes: the CD-ROM goes on an IDE controller here
	// (docs/vsphere.md, "vcsim and vCenter").
	sata := "<rasd:ResourceSubType>vmware.sata.ahci</rasd:ResourceSubType>\n        <rasd:ResourceType>20</rasd:ResourceType>"
	if !bytes.Contains(ovfDesc, []byte(sata)) {
		t.Fatal("testdata/image.ovf has no SATA controller to replace")
	}
	ovfDesc = bytes.Replace(ovfDesc, []byte(sata), []byte("<rasd:ResourceType>5</rasd:ResourceType>"), 1)
	vmdkBytes, err := os.ReadFile(disk)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, f := range []struct {
		name string
		body []byte
	}{{"image.ovf", ovfDesc}, {"image-disk1.vmdk", vmdkBytes}} {
		if err := tw.WriteHeader(&tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(f.body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "image")
	if err := os.WriteFile(img, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	return img
}

// smallVM is a small VM for the tests.
func smallVM(extra map[string]any) driver.Props {
	m := map[string]any{"cpu": 1, "ram": 512, "disk": 1024}
	for k, v := range extra {
		m[k] = v
	}
	return driver.PropsOf(m)
}

func manualNet(ip, pg string) driver.Networks {
	return driver.Networks{"default": {Type: "manual", IP: ip, Netmask: "255.255.255.0", Gateway: "10.0.0.1",
		CloudProperties: driver.PropsOf(map[string]any{"name": pg})}}
}

var bg = context.Background()

func driverSpec(t testing.TB) driver.StemcellSpec {
	return driver.StemcellSpec{ImagePath: stemcellImage(t)}
}
