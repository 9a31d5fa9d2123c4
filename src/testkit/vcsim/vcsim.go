// Package vcsim runs govmomi's vCenter simulator in the test's process, as
// the vsphere driver's tests and the callers' (garm, the orchestrator)
// need it, and makes stemcell images as the Director hands them over.
package vcsim

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/tls"
	_ "embed"
	"encoding/pem"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vmdk"
)

// The OVF descriptor of every stemcell image made here: embedded, as a
// path from runtime.Caller would not survive -trimpath (scripts/test).
//
//go:embed testdata/image.ovf
var imageOVF string

// Sim is vcsim on 127.0.0.1 with TLS: two datacenters (DC0, DC1), each
// with two clusters of one host (DCn_C0, DCn_C1), a child resource pool
// per cluster (DCn_Cm_RP1), two datastores every host mounts (LocalDS_0,
// LocalDS_1), a distributed port group (DCn_DVPG0) and "VM Network".
type Sim struct {
	Model  *simulator.Model
	Server *simulator.Server
	// Host is host:port; User and Password the account vcsim checks.
	Host, User, Password string
	// CAPEM is the server's certificate (its own CA).
	CAPEM string
}

// Start runs a simulator for the test.
func Start(t testing.TB) *Sim {
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
	return &Sim{Model: m, Server: s, Host: s.URL.Host, User: s.URL.User.Username(), Password: pw, CAPEM: string(ca)}
}

// Section is a vsphere driver section for datacenter DC0 with extra keys
// over it.
func (v *Sim) Section(extra map[string]any) map[string]any {
	c := map[string]any{
		"host": v.Host, "user": v.User, "password": v.Password,
		"connection_options": map[string]any{"ca_cert": v.CAPEM},
		"datacenters": []any{map[string]any{
			"name": "DC0", "datastore_pattern": `\ALocalDS_`, "persistent_datastore_pattern": `\ALocalDS_`,
			"clusters": []any{"DC0_C0", map[string]any{"DC0_C1": map[string]any{"resource_pool": "DC0_C1_RP1"}}},
		}},
		"poll_max_ms": 50,
	}
	for k, x := range extra {
		c[k] = x
	}
	return c
}

// StemcellImage is a stemcell's image as the Director hands it over: a
// gzipped tarball of image.ovf (testdata: the shape ovftool gives the
// stemcell builder's VMX) and a streamOptimized vmdk.
func StemcellImage(t testing.TB) string {
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
	ovfDesc := []byte(imageOVF)
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
