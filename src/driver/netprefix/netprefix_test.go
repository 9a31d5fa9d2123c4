package netprefix

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/runway-cpi/runway/src/driver"
)

// The Director's network settings (cloudfoundry/bosh: deployment_plan's
// manual_network.rb, dynamic_network.rb and vip_network.rb) carry prefix
// as a string: "32" (one IPv4 address) unless a subnet says otherwise.
func TestDirectorPrefixIsOneAddress(t *testing.T) {
	var nets driver.Networks
	err := json.Unmarshal([]byte(`{
		"manual": {"type": "manual", "ip": "10.0.16.5", "prefix": "32", "netmask": "255.255.240.0", "gateway": "10.0.16.1",
			"dns": ["8.8.8.8"], "default": ["dns", "gateway"], "cloud_properties": {"net_id": "n"}, "nic_group": "1"},
		"dynamic": {"type": "dynamic", "prefix": "32", "dns": ["8.8.8.8"], "cloud_properties": {}},
		"vip": {"type": "vip", "ip": "203.0.113.9", "prefix": "32", "cloud_properties": {}},
		"v6": {"type": "manual", "ip": "2001:db8::5", "prefix": "128", "cloud_properties": {}},
		"numeric": {"type": "manual", "ip": "10.0.0.5", "prefix": 32, "cloud_properties": {}},
		"none": {"type": "manual", "ip": "10.0.0.6", "cloud_properties": {}}}`), &nets)
	if err != nil {
		t.Fatal(err)
	}
	for name, n := range nets {
		if err := CheckNoDelegation(n, name, "openstack"); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
	// The agent reads prefix as a string, whatever the caller sent.
	b, _ := json.Marshal(nets["numeric"])
	if !strings.Contains(string(b), `"prefix":"32"`) {
		t.Errorf("prefix written as %s", b)
	}
	if b, _ := json.Marshal(nets["none"]); strings.Contains(string(b), "prefix") {
		t.Errorf("absent prefix written: %s", b)
	}
}

func TestDelegatedPrefixRefusedByName(t *testing.T) {
	for _, c := range []struct {
		n    driver.Network
		want error
		msg  string
	}{
		{driver.Network{Type: "manual", IP: "10.0.1.16", Prefix: "28"}, driver.ErrNotSupported, "networks.pods.prefix 28 (prefix delegation) is not supported by the openstack driver"},
		{driver.Network{Type: "manual", IP: "2001:db8::", Prefix: "80"}, driver.ErrNotSupported, "networks.pods.prefix 80"},
		{driver.Network{Type: "manual", IP: "10.0.1.16", Prefix: "128"}, driver.ErrNotSupported, "networks.pods.prefix 128"},
		{driver.Network{Type: "dynamic", Prefix: "24"}, driver.ErrNotSupported, "networks.pods.prefix 24"},
		{driver.Network{Type: "manual", IP: "10.0.1.16", Prefix: "many"}, driver.ErrInvalidInput, `networks.pods.prefix "many" is not a prefix length`},
	} {
		err := CheckNoDelegation(c.n, "pods", "openstack")
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%+v: %v; want %v %q", c.n, err, c.want, c.msg)
		}
	}
}
